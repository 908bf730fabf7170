"""The settings a memory plan is computed for (`PlanInputs`), the rollout engine's part of them
(`EngineMemory`) and the plan's rows (`Term`).

Where it sits: plan/inputs.py builds `PlanInputs` from the config (plan/engines.py has the
`EngineMemory` of each `rollout.engine`); plan/memory.py computes the plan from it, with the rows
of plan/lora.py and plan/host.py, which read it too. Apart from memory.py so that they can.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from exgrpo_cli.parallel.placement import Offload
from exgrpo_cli.plan.arch import Arch

MARGIN = 0.10  # share of a device's memory the plan leaves free (fragmentation, estimates' error)


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up (a count sharded over b ranks: FSDP2 pads the last shard)."""
    return -(-a // b)


@dataclass(frozen=True)
class Term:
    name: str
    bytes: tuple[int, int, int, int]  # per phase, in memory.PHASES order


# (arch, inputs) -> an engine's own (terms, problems, notes)
EngineTerms = Callable[[Arch, "PlanInputs"], tuple[list[Term], list[str], list[str]]]


@dataclass(frozen=True)
class EngineMemory:
    """What the plan reads of a rollout engine: its plan/engines.py entry (plan/inputs.py picks it)."""

    label: str  # its name in the plan's table and notes
    # the trainer's own (FSDP) module generates (root and layers gathered in the rollout), else the
    # engine holds its weights and KV cache in its share (rollout.gpu_memory_utilization), frees them
    # under rollout.sleep_mode on a GPU, and its sequences reach vllm_max_len
    needs_trainer_model: bool
    memory: EngineTerms  # hf_rollout_terms, vllm_terms, ...


@dataclass(frozen=True)
class PlanInputs:
    """Everything the plan reads besides the architecture (built from the config by plan.inputs)."""

    ranks: int  # N: data-parallel ranks, one device each
    device: str  # cuda | cpu
    device_bytes: int  # memory of one device (on a CPU: the host's share of one rank)
    weight_bytes: int  # w: 4 for model.dtype=float32
    mixed_bytes: int  # compute bytes under trainer.fsdp_mixed_precision (0: none)
    offload: Offload  # trainer.offload's entry of policy.placement.OFFLOAD_MODES
    checkpointing: bool  # model.gradient_checkpointing
    token_budget: int  # algo.micro_batch_tokens, 0 resolved to the device's default
    seq_tokens: int  # S: model.max_prompt_tokens + model.max_response_tokens
    engine: EngineMemory  # rollout.engine's entry of plan.engines.ENGINE_MEMORY
    vllm_share: float  # u: rollout.gpu_memory_utilization
    vllm_sleep: bool  # rollout.sleep_mode: vLLM frees its weights and KV cache for the update
    vllm_max_len: int  # vLLM's max_model_len: prompt + max(response, eval.max_new_tokens)
    rollout_sequences: int  # sequences one rank samples in a step (questions x n / N)
    attention: str  # flash | sdpa | eager: the kernels the trainer's model runs
    vllm_cuda_graphs: bool = True  # not rollout.enforce_eager: vLLM captures CUDA graphs on a GPU
    # host memory (plan/host.py, GPU runs): ranks sharing a node (0: all), a node's memory (0:
    # unknown, nothing compared), vLLM's level-1 sleep after validation (rollout.validation_sleep_level=1)
    ranks_per_node: int = 0
    node_bytes: int = 0
    level1_backups: bool = False
    fp32_head: bool = False  # model.fp32_head: the trainer's head computes from an fp32 copy
    # model.lora (0: full fine-tuning): the adapter's rank and target modules, rollout.lora_sync
    # (plan/lora.py has its rows)
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    lora_sync: str = "adapter"

    @property
    def fsdp(self) -> bool:
        """The trainer shards with FSDP2 from two ranks on, and on a GPU from one (so that mixed
        precision and offload apply there: parallel/fsdp.shards_alone). Not on one CPU
        process, whatever trainer.offload says (the trainer refuses offload=all there, and
        offload=optimizer is HostAdamW on a plain model)."""
        return self.ranks > 1 or self.device == "cuda"

    @property
    def compute_bytes(self) -> int:
        """c: FSDP2 applies mixed precision on CUDA only; without FSDP the model computes in w."""
        mixed = self.fsdp and self.device == "cuda" and self.mixed_bytes > 0
        return self.mixed_bytes if mixed else self.weight_bytes

    @property
    def reduce_bytes(self) -> int:
        """r: gradients are reduce-scattered in fp32 under mixed precision (parallel/fsdp.py)."""
        return 4 if self.compute_bytes != self.weight_bytes else self.weight_bytes

    @property
    def vllm_bytes(self) -> int:
        """vLLM's weights' dtype: the mixed-precision compute dtype on CUDA, else model.dtype."""
        return self.mixed_bytes if self.device == "cuda" and self.mixed_bytes else self.weight_bytes

    @property
    def micro_batch_tokens(self) -> int:
        """T: rows x longest row <= budget, but a micro-batch holds at least one row."""
        return max(self.token_budget, self.seq_tokens)

    @property
    def limit(self) -> int:
        return int(self.device_bytes * (1 - MARGIN))
