"""The plan's arithmetic with exact values on a toy architecture, term by term and phase by phase.

Toy: H=8, I=16, L=2, 2 heads of 4, 1 KV head, V=32, untied, q/k/v biases.
  layer = 2*8*8 + 2*8*4 + (8+4+4) + 3*8*16 + 2*8 = 128 + 64 + 16 + 384 + 16 = 608
  root  = 2*32*8 + 8 = 520          P = 2*608 + 520 = 1736
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from exgrpo_cli.parallel.placement import OFFLOAD_MODES
from exgrpo_cli.plan.activations import (
    LOGIT_TEMPS,
    activation_bytes_per_token,
    chunk_tokens,
    layer_activation_bytes,
)
from exgrpo_cli.plan.arch import Arch
from exgrpo_cli.plan.engines import ENGINE_MEMORY
from exgrpo_cli.plan.memory import (
    CPU_VLLM_KV_BYTES,
    CUDA_CONTEXT_BYTES,
    TORCH_WORKSPACE_BYTES,
    VLLM_CUDA_GRAPH_BYTES,
    GiB,
    PlanInputs,
    plan_memory,
    vllm_workspace_bytes,
)

TOY = Arch(
    hidden_size=8,
    intermediate_size=16,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    vocab_size=32,
    tied_embeddings=False,
    max_positions=128,
    attention_bias=True,
)
X = PlanInputs(
    ranks=2,
    device="cuda",
    device_bytes=8 * GiB,
    weight_bytes=4,
    mixed_bytes=2,
    offload=OFFLOAD_MODES["none"],
    checkpointing=True,
    token_budget=64,
    seq_tokens=48,
    engine=ENGINE_MEMORY["vllm"],
    vllm_share=0.5,
    vllm_sleep=False,
    vllm_max_len=48,
    rollout_sequences=8,
    attention="flash",
)


def _terms(x: PlanInputs) -> dict[str, tuple[int, ...]]:
    return {t.name.split(" (")[0]: t.bytes for t in plan_memory(TOY, x).terms}


def test_toy_counts() -> None:
    assert (TOY.layer_params, TOY.root_params, TOY.params, TOY.largest_param) == (608, 520, 1736, 256)


def test_activations_per_token() -> None:
    # layer, c=2: 8H + 8 + 4cH + 2cq + 2ckv + 4nh + 4cI = 64 + 8 + 64 + 32 + 16 + 8 + 128
    assert layer_activation_bytes(TOY, 2) == 320
    # sdpa on padded rows: + 2c(q - kv) + cS = 16 + 2*48; eager: + 16 - 8 + (4 + 2) * 2 * 48
    assert layer_activation_bytes(TOY, 2, "sdpa", 48) == 320 + 16 + 96
    assert layer_activation_bytes(TOY, 2, "eager", 48) == 320 + 16 - 8 + 576
    # + backward working set 3cI + 2cH = 128, + top 4H + 4 + 3cH + 17 + 2c hd = 32 + 4 + 48 + 17 + 16
    assert activation_bytes_per_token(TOY, 2, checkpointing=True) == 2 * 16 + 320 + 128 + 117
    assert activation_bytes_per_token(TOY, 2, checkpointing=False) == 2 * 320 + 128 + 117


def test_fsdp_plan_term_by_term() -> None:
    shard, c_root, vllm = 4 * 868, 2 * 520, 4 * GiB - VLLM_CUDA_GRAPH_BYTES
    chunks = LOGIT_TEMPS * 64 * 32 * 4  # a chunk is at most the micro-batch's 64 tokens
    assert _terms(X) == {
        "weights": (shard,) * 4,
        "gradients": (0, shard, shard, shard),
        "AdamW moments": (2 * shard,) * 4,
        "AdamW step temporaries": (0, 0, 0, shard),
        "root unit gathered": (0, c_root, c_root, 0),  # resharded after scoring, before the rollout
        "layers in flight": (0, 2 * 2 * 608, 0, 0),
        "layer gradient reduce": (0, 608 * (2 + 4), 0, 0),
        "root gradient reduce": (0, 0, 520 * (2 + 4) + 4 * 520 // 2, 0),
        "activations": (0, 64 * 597, 0, 0),
        "head gradient": (0, 2 * 256, 0, 0),
        "log-prob chunks": (0, chunks, 0, 0),
        "vLLM share": (vllm,) * 4,
        "vLLM CUDA graphs": (VLLM_CUDA_GRAPH_BYTES,) * 4,
        "weight sync": (4 * 256, 0, 0, 0),
        "CUDA context, NCCL": (CUDA_CONTEXT_BYTES,) * 4,
        "torch workspaces, inputs": (TORCH_WORKSPACE_BYTES,) * 4,
    }
    plan = plan_memory(TOY, X)
    assert plan.totals[1] == sum(v[1] for v in _terms(X).values())
    assert plan.fits and plan.host_bytes == 0
    assert "KV cache" in plan.notes[0]


def test_vllm_asleep_frees_its_share_for_the_update_but_not_its_cuda_graphs() -> None:
    asleep = _terms(dataclasses.replace(X, vllm_sleep=True))
    assert asleep["vLLM share"] == (4 * GiB - VLLM_CUDA_GRAPH_BYTES, 0, 0, 0)
    assert asleep["vLLM CUDA graphs"] == (VLLM_CUDA_GRAPH_BYTES,) * 4  # sleep does not release them
    eager = _terms(dataclasses.replace(X, vllm_sleep=True, vllm_cuda_graphs=False))
    assert "vLLM CUDA graphs" not in eager and eager["vLLM share"] == (4 * GiB, 0, 0, 0)


def test_vllm_workspace_follows_the_limits_the_engine_is_given() -> None:
    from exgrpo_cli.plan.memory import VLLM_MAX_BATCHED_TOKENS, VLLM_MAX_SEQS, VLLM_NON_TORCH_BYTES
    from exgrpo_cli.rollout.vllm_launch import memory_kwargs

    # one layer's peak per token in the compute dtype (3H + q + 2kv + 3I) + fp32 logits/log-probs
    per_token = 2 * (3 * 8 + 8 + 2 * 4 + 3 * 16)
    want = VLLM_MAX_BATCHED_TOKENS * per_token + VLLM_MAX_SEQS * 32 * 8 + VLLM_NON_TORCH_BYTES
    assert vllm_workspace_bytes(TOY, X) == want
    longer = dataclasses.replace(X, vllm_max_len=20000)  # a context longer than the token limit
    assert vllm_workspace_bytes(TOY, longer) == want + (20000 - VLLM_MAX_BATCHED_TOKENS) * per_token
    kw = memory_kwargs(True, 0.5, 20000)  # what the CUDA engine passes: the plan's limits
    assert (kw["max_num_batched_tokens"], kw["max_num_seqs"]) == (20000, VLLM_MAX_SEQS)
    assert memory_kwargs(True, 0.5, 100)["max_num_batched_tokens"] == VLLM_MAX_BATCHED_TOKENS


def test_host_adamw_brings_one_parameters_moments_to_the_device() -> None:
    """offload=optimizer: HostAdamW's step holds the largest parameter's (shard's) two fp32 moments,
    the sqrt and the denominator on the device: 16 bytes an element (7B's embedding: 8.1 GiB)."""
    opt = _terms(dataclasses.replace(X, offload=OFFLOAD_MODES["optimizer"]))
    assert opt["AdamW step temporaries"] == (0, 0, 0, 16 * 256 // 2)
    one = _terms(dataclasses.replace(X, offload=OFFLOAD_MODES["optimizer"], ranks=1))
    assert one["AdamW step temporaries"] == (0, 0, 0, 16 * 256)


def test_offload_moves_the_state_to_the_host() -> None:
    opt = _terms(dataclasses.replace(X, offload=OFFLOAD_MODES["optimizer"]))
    assert "AdamW moments" not in opt and opt["weights"] == (4 * 868,) * 4
    everything = plan_memory(TOY, dataclasses.replace(X, offload=OFFLOAD_MODES["all"]))
    names = {t.name.split(" (")[0] for t in everything.terms}
    # the weight sync gathers each shard on the compute device (NCCL refuses host tensors)
    assert not names & {"weights", "gradients", "AdamW moments"} and "weight sync" in names
    assert everything.host_bytes == 16 * 868


def test_one_cpu_process_trains_without_fsdp_in_the_weights_dtype() -> None:
    one = dataclasses.replace(X, ranks=1, device="cpu", engine=ENGINE_MEMORY["hf"])
    terms = _terms(one)
    assert not {"root unit gathered", "layers in flight", "weight sync"} & set(terms)
    assert terms["weights"] == (4 * 1736,) * 4
    assert terms["head gradient"] == (0, 4 * 256, 4 * 256, 0)  # fp32 compute: c = w
    assert terms["activations"][1] == 64 * activation_bytes_per_token(TOY, 4, checkpointing=True)


def test_one_cpu_process_is_never_sharded_whatever_the_offload() -> None:
    """The trainer wraps one CPU process with nothing (it refuses offload=all there, and
    offload=optimizer is HostAdamW on the plain model): the plan must not count FSDP's terms."""
    for name in ("optimizer", "all"):
        offload = OFFLOAD_MODES[name]
        one = dataclasses.replace(X, ranks=1, device="cpu", engine=ENGINE_MEMORY["hf"], offload=offload)
        assert not one.fsdp
        assert not {"root unit gathered", "layers in flight"} & set(_terms(one))


def test_one_gpu_shards_with_fsdp2_and_its_mixed_precision() -> None:
    """On a GPU FSDP2 wraps even one rank (parallel/fsdp.shards_alone), so its bf16 compute
    and offload apply there too."""
    one = dataclasses.replace(X, ranks=1)
    assert one.fsdp and plan_memory(TOY, one).inputs.compute_bytes == 2
    assert plan_memory(TOY, dataclasses.replace(one, offload=OFFLOAD_MODES["all"])).inputs.compute_bytes == 2


def test_a_micro_batch_holds_at_least_one_sequence() -> None:
    short_budget = dataclasses.replace(X, token_budget=16)
    assert short_budget.micro_batch_tokens == 48
    assert _terms(short_budget)["activations"][1] == 48 * 597


def test_cpu_host_plan_has_no_cuda_terms() -> None:
    cpu = dataclasses.replace(X, device="cpu", ranks=1)
    terms = _terms(cpu)
    assert "CUDA context, NCCL" not in terms and "torch workspaces, inputs" not in terms
    assert terms["vLLM"] == (4 * 1736 + CPU_VLLM_KV_BYTES,) * 4


def test_hf_engine_rollout() -> None:
    hf = _terms(dataclasses.replace(X, engine=ENGINE_MEMORY["hf"]))
    # 8 sequences x 48 tokens x (2 L kv c = 2*2*4*2)
    assert hf["HF KV cache"] == (8 * 48 * 32, 0, 0, 0)
    assert hf["HF logits"][0] == 8 * 32 * 4 * 2 + (1 << 30)
    assert hf["layers in flight"][0] == 2 * 2 * 608


def test_problems_stop_the_plan() -> None:
    too_long = plan_memory(TOY, dataclasses.replace(X, seq_tokens=200, vllm_max_len=200))
    assert not too_long.fits and "128 positions" in too_long.problems[0]
    no_kv = plan_memory(TOY, dataclasses.replace(X, vllm_share=vllm_workspace_bytes(TOY, X) / (8 * GiB)))
    assert not no_kv.fits and "not one sequence" in no_kv.problems[0]


def test_the_limit_keeps_a_tenth_free() -> None:
    assert X.limit == int(8 * GiB * 0.9)


def test_constants_equal_the_trainers() -> None:
    from exgrpo_cli.plan import activations
    from exgrpo_cli.plan import memory as M
    from exgrpo_cli.policy import forward
    from exgrpo_cli.rollout.hf import HFEngine

    assert M.AUTO_TOKEN_BUDGET == forward.AUTO_TOKEN_BUDGET
    assert activations.LOGIT_CHUNK_BYTES == forward.LOGIT_CHUNK_BYTES
    for vocab in (364, 49152, 152064, 10**7):
        assert chunk_tokens(vocab) == forward.chunk_tokens(vocab)
    defaults = inspect.signature(HFEngine.__init__).parameters
    assert defaults["max_batch"].default == M.HF_MAX_BATCH
    assert defaults["logits_budget_bytes"].default == M.HF_LOGITS_BUDGET


@pytest.mark.parametrize("ranks", [1, 3, 8])
def test_shards_round_up(ranks: int) -> None:
    assert _terms(dataclasses.replace(X, ranks=ranks))["weights"][0] == 4 * -(-1736 // ranks)


def test_fp32_head_counts_its_copy_only_under_a_16_bit_compute_dtype() -> None:
    with_head = dataclasses.replace(X, fp32_head=True)
    copy = 4 * 32 * 8  # V x H in fp32
    assert _terms(with_head)["fp32 head copy"] == (0, copy, 0, 0)
    assert plan_memory(TOY, with_head).totals[1] == plan_memory(TOY, X).totals[1] + copy
    hf = _terms(dataclasses.replace(with_head, engine=ENGINE_MEMORY["hf"]))
    assert hf["fp32 head copy"] == (copy, copy, 0, 0)  # HF generation projects through it too
    assert "fp32 head copy" not in _terms(dataclasses.replace(with_head, mixed_bytes=0))  # fp32 already
    assert "fp32 head copy" not in _terms(X)
