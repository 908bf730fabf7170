"""The memory plan's LoRA numbers (`model.lora.rank` > 0): the adapter's size from the architecture.

Where it sits: beside plan/activations.py, read by plan/memory.py's terms when the run trains a LoRA
adapter (policy/lora.py) instead of every weight. Pure arithmetic on `Arch` (no torch).

A LoRA adapter of rank r on a linear module of `in` inputs and `out` outputs holds A (r x in) and
B (out x r): r (in + out) parameters. Per decoder layer the projections have the shapes below
(H hidden, q = heads x head size, kv = KV heads x head size, I MLP width); `lm_head` (H -> V) is a
root-unit module. Other names match nothing the plan knows of and are not counted (said in the
plan's notes); the trainer refuses target modules that match nothing in the model itself.
"""

from __future__ import annotations

from exgrpo_cli.config.checks import vllm_max_lora_rank
from exgrpo_cli.plan.arch import Arch
from exgrpo_cli.plan.settings import PlanInputs, Term, ceil_div


def layer_modules(arch: Arch) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear module of a decoder layer, by the name peft matches."""
    h, q, kv, i = arch.hidden_size, arch.q_dim, arch.kv_dim, arch.intermediate_size
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def uncounted(targets: tuple[str, ...], arch: Arch) -> list[str]:
    """Target names the plan cannot size (not a projection it knows, nor lm_head)."""
    known = {*layer_modules(arch), "lm_head"}
    return [t for t in targets if t not in known]


def layer_adapter_params(arch: Arch, rank: int, targets: tuple[str, ...]) -> int:
    """A_l: one decoder layer's adapter parameters, sum of r (in + out) over its targeted modules."""
    return sum(rank * (i + o) for m, (i, o) in layer_modules(arch).items() if m in targets)


def root_adapter_params(arch: Arch, rank: int, targets: tuple[str, ...]) -> int:
    """A_r: the root unit's adapter (on lm_head only, when targeted)."""
    return rank * (arch.hidden_size + arch.vocab_size) if "lm_head" in targets else 0


def adapter_params(arch: Arch, rank: int, targets: tuple[str, ...]) -> int:
    """A: the whole adapter (rank 64 on the seven projections of Qwen2.5-7B: 161.5M)."""
    return arch.num_layers * layer_adapter_params(arch, rank, targets) + root_adapter_params(
        arch, rank, targets
    )


def adapter_tensors(arch: Arch, rank: int, targets: tuple[str, ...]) -> list[int]:
    """Element counts of the adapter's tensors, one per tensor (A: r x in, B: out x r): FSDP2 shards
    and offloads each on its own."""
    layer = [n for m, (i, o) in layer_modules(arch).items() if m in targets for n in (rank * i, rank * o)]
    root = [rank * arch.hidden_size, rank * arch.vocab_size] if "lm_head" in targets else []
    return layer * arch.num_layers + root


def largest_adapter_param(arch: Arch, rank: int, targets: tuple[str, ...]) -> int:
    """Elements of the adapter's largest single tensor (r x the widest targeted side)."""
    sides = [max(i, o) for m, (i, o) in layer_modules(arch).items() if m in targets]
    if "lm_head" in targets:
        sides.append(arch.vocab_size)
    return rank * max(sides, default=0)


def largest_adapted_weight(arch: Arch, targets: tuple[str, ...]) -> int:
    """Elements of the largest base weight that carries an adapter (what the merged sync merges)."""
    sizes = [i * o for m, (i, o) in layer_modules(arch).items() if m in targets]
    if "lm_head" in targets:
        sizes.append(arch.embedding_params)
    return max(sizes, default=0)


def adapter_activation_bytes_per_token(
    arch: Arch, rank: int, targets: tuple[str, ...], compute_bytes: int, checkpointing: bool
) -> int:
    """What the adapters add to the backward's saved activations, per token, at most: for each
    targeted module its input (a copy when dropout is on; the base's own input otherwise) and the
    r-wide output of A, in the compute dtype; for one layer (its recompute) under gradient
    checkpointing, for every layer without. An upper bound, not measured."""
    per_layer = sum(compute_bytes * (i + rank) for m, (i, _) in layer_modules(arch).items() if m in targets)
    return per_layer * (1 if checkpointing else arch.num_layers)


def vllm_lora_buffer_bytes(arch: Arch, rank: int, targets: tuple[str, ...], dtype_bytes: int) -> int:
    """vLLM's LoRA buffers with the adapter sync (enable_lora, max_loras=1): A and B stacked for one
    adapter at vLLM's rank (rank rounded up to one it accepts) on every targeted module, in its
    dtype; allocated with the model, inside its share. 0 above vLLM's largest rank (refused)."""
    max_rank = vllm_max_lora_rank(rank)
    return dtype_bytes * adapter_params(arch, max_rank, targets) if max_rank else 0


# ------------------------------------------------------------------ the plan's rows with LoRA
def state_rows(arch: Arch, x: PlanInputs) -> list[Term]:
    """The trainer's state with LoRA, sharded over N ranks by FSDP2 like the full model's:
    frozen base       c P/N at every moment (compute dtype, no gradient, no optimizer state;
                      on the host with offload=all). The issue's design; on CUDA the trainer must
                      keep it so (FSDP2 asks a uniform dtype of trainable parameters only): a
                      base kept in model.dtype=float32 is w P/N, 14.2 GiB more at 7B.
    adapter weights   w A/N, its gradients w A/N from the backward to the step, AdamW's moments
                      2 w A/N, AdamW's step temporaries w A/N (HostAdamW: 16 bytes x the
                      largest adapter tensor's shard), placed as trainer.offload says."""
    mode = x.offload
    a = adapter_params(arch, x.lora_rank, x.lora_targets)
    base = 0 if mode.params_on_host else x.compute_bytes * ceil_div(arch.params, x.ranks)
    shard = x.weight_bytes * ceil_div(a, x.ranks)
    weights = 0 if mode.params_on_host else shard
    moments = 0 if mode.moments_on_host else 2 * shard
    host_adamw = 16 * ceil_div(largest_adapter_param(arch, x.lora_rank, x.lora_targets), x.ranks)
    step = host_adamw if mode.host_adamw else (0 if mode.moments_on_host else shard)
    dtype = {4: "fp32", 2: "16-bit"}
    part = " shard" if x.fsdp else ""
    compute = "bf16" if x.compute_bytes != x.weight_bytes else dtype.get(x.compute_bytes, "")
    return [
        Term(f"frozen base ({compute}{part})", (base,) * 4),
        Term(f"adapter weights ({dtype.get(x.weight_bytes, '')}{part})", (weights,) * 4),
        Term("adapter gradients", (0, weights, weights, weights)),
        Term("adapter AdamW moments", (moments,) * 4),
        Term("AdamW step temporaries", (0, 0, 0, step)),
    ]


def gathered_rows(arch: Arch, x: PlanInputs) -> list[Term]:
    """FSDP2's gathers with LoRA: the root (c P_r, with its adapter when lm_head is targeted) and
    two layers in flight (2 c (P_l + A_l)) as without; the gradient reduce-scatters carry only the
    adapter's gradients: A_l (c + r) a layer, A_r (c + r + r/N) for the root."""
    if not x.fsdp:
        return []
    c, r = x.compute_bytes, x.reduce_bytes
    a_l = layer_adapter_params(arch, x.lora_rank, x.lora_targets)
    a_r = root_adapter_params(arch, x.lora_rank, x.lora_targets)
    root, layer = c * (arch.root_params + a_r), 2 * c * (arch.layer_params + a_l)
    hf_rollout = x.engine.needs_trainer_model
    return [
        Term("root unit gathered", (root if hf_rollout else 0, root, root, 0)),
        Term("layers in flight (2)", (layer if hf_rollout else 0, layer, 0, 0)),
        Term("layer gradient reduce", (0, a_l * (c + r), 0, 0)),
        Term("root gradient reduce", (0, 0, a_r * (c + r) + ceil_div(r * a_r, x.ranks), 0)),
    ]


def head_gradient_params(arch: Arch, x: PlanInputs) -> int:
    """The output head's weight gradient: none for a frozen head, its adapter's with lm_head targeted."""
    return root_adapter_params(arch, x.lora_rank, x.lora_targets)


def activation_row(arch: Arch, x: PlanInputs) -> Term:
    per_token = adapter_activation_bytes_per_token(
        arch, x.lora_rank, x.lora_targets, x.compute_bytes, x.checkpointing
    )
    return Term("adapter activations (at most)", (0, x.micro_batch_tokens * per_token, 0, 0))


def vllm_buffers(arch: Arch, x: PlanInputs) -> int:
    """vLLM's LoRA buffers: with the adapter sync only (merged weights need none)."""
    if x.lora_sync != "adapter":
        return 0
    return vllm_lora_buffer_bytes(arch, x.lora_rank, x.lora_targets, x.vllm_bytes)


def sync_bytes(arch: Arch, x: PlanInputs) -> int:
    """The trainer's extra memory while it syncs vLLM (rollout/vllm_lora.py), under FSDP:
    adapter  the base, one gathered weight at a time in vLLM's dtype (at start-up and after a
             sleep that dropped it; each step's adapter is far smaller)
    merged   every step, the same for a plain weight, and for an adapted one its gathered base
             (vLLM's dtype), the fp32 product B A and sum, and the cast: (2 d + 8) x its size."""
    plain = x.vllm_bytes * arch.largest_param
    if x.lora_sync != "merged":
        return plain
    return max(plain, (2 * x.vllm_bytes + 8) * largest_adapted_weight(arch, x.lora_targets))


def host_state_bytes(arch: Arch, x: PlanInputs) -> int:
    """Offloaded state per rank on the host with LoRA: with offload=all the frozen base (c P/N) and
    the adapter's weights, gradients and moments (4 w A/N); with offload=optimizer its two fp32
    moments (8 A/N)."""
    mode = x.offload
    a = ceil_div(adapter_params(arch, x.lora_rank, x.lora_targets), x.ranks)
    if mode.params_on_host:
        return x.compute_bytes * ceil_div(arch.params, x.ranks) + 4 * x.weight_bytes * a
    return 8 * a if mode.moments_on_host else 0
