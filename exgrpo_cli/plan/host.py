"""Host memory of a training run on GPUs: what each rank pins or keeps in its node's memory.

Where it sits: beside `memory.plan_memory` (which plans each GPU), at start-up and in dry runs;
`report` prints a row per node and refuses a node whose memory it would exceed. Pinned (page-locked)
memory cannot be swapped out: a node that runs short of it is killed by the kernel's OOM killer
(or stalls), not slowed down, so it is planned like the GPUs' memory.

Pinned blocks go through torch's caching host allocator (`pin_memory=True`, `Tensor.pin_memory()`,
non-blocking copies to the host), which rounds every block up to a power of two and keeps freed
blocks for the rest of the process (only `torch._C._host_emptyCache()` returns them, which nothing
here calls). Per rank:
  offloaded state   offload=optimizer: HostAdamW's one pinned buffer of both fp32 moments of the
                    rank's shard, 8 P/N bytes, rounded up once; offload=all: FSDP2 pins each
                    parameter's shard and each gradient's shard (w bytes an element, every tensor
                    rounded up on its own) and AdamW's moments stay pageable (2 w P/N, no rounding);
                    with LoRA (`lora_offload_terms`) the same for the adapter's A/N parameters only,
                    plus the frozen base's shards in the compute dtype under offload=all
  level-1 backups   rollout.validation_sleep_level=1 (vLLM on CUDA with rollout.sleep_mode): after
                    validation vLLM's sleep copies each memory block of its weights into a pinned
                    host tensor of the block's size; the next wake copies them back and frees the
                    tensors into the cache, where they stay. vLLM's blocks are the CUDA caching
                    allocator's segments (its sleep pool is a pluggable allocator under it): a
                    tensor over 10 MiB in a segment of its own rounded up to 2 MiB, tensors of
                    1-10 MiB sharing 20 MiB segments, smaller ones 2 MiB segments (`cuda_segments`)
  process           PROCESS_BYTES (assumed, not measured): Python, torch and CUDA's host side,
                    NCCL's and vLLM's host buffers, among them what a level-2 sleep still pins:
                    vLLM's sleep allocator backs up its small pool outside the weights and the KV
                    cache (the runtime's own allocations) to pinned host memory at every sleep,
                    level 2 included (level 2 drops the weights, not that pool)
and once per node, at start-up only: rank 0 reads the checkpoint into host memory in model.dtype
(P w; the other ranks receive their shards), before any level-1 backup exists. A node's figure is
the larger of start-up and the steady state.
"""

from __future__ import annotations

from dataclasses import dataclass

import exgrpo_cli.plan.lora as lora
from exgrpo_cli.parallel.placement import Offload
from exgrpo_cli.plan.arch import Arch
from exgrpo_cli.plan.settings import PlanInputs, ceil_div

GiB = 2**30
MiB = 2**20
MARGIN = 0.10  # share of a node's memory left to the OS, the page cache and data loading
# torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): how allocations become segments
SMALL_ALLOC = 1 * MiB  # kSmallSize: allocations up to this share kSmallBuffer segments
SMALL_SEGMENT = 2 * MiB  # kSmallBuffer
MID_ALLOC = 10 * MiB  # kMinLargeAlloc: larger allocations get a segment of their own
MID_SEGMENT = 20 * MiB  # kLargeBuffer: shared by allocations of 1-10 MiB
ROUND_LARGE = 2 * MiB  # kRoundLarge: a large allocation's segment is rounded up to this
PROCESS_BYTES = 4 * GiB  # assumed host memory of one rank's process besides what is listed
NODE_GPUS = 8  # ranks per node assumed for trainer.plan_devices (trainer.plan_ranks_per_node=0)


def pow2(n: int) -> int:
    """What torch's caching host allocator reserves for a pinned block of `n` bytes."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def hf_tensors(arch: Arch) -> list[int]:
    """Element counts of the trainer's (Hugging Face) parameters, one per tensor: FSDP2 shards and
    offloads each on its own."""
    h, q, kv, i = arch.hidden_size, arch.q_dim, arch.kv_dim, arch.intermediate_size
    layer = [h * q, h * kv, h * kv, q * h, h * i, h * i, i * h, h, h]
    if arch.attention_bias:
        layer += [q, kv, kv]
    root = [arch.embedding_params] * (1 if arch.tied_embeddings else 2) + [h]
    return layer * arch.num_layers + root


def vllm_tensors(arch: Arch) -> list[int]:
    """Element counts of vLLM's parameters: q/k/v fused into one qkv_proj (and its bias), gate and
    up into one gate_up_proj, as its Qwen2/Llama models hold them."""
    h, q, kv, i = arch.hidden_size, arch.q_dim, arch.kv_dim, arch.intermediate_size
    layer = [h * (q + 2 * kv), q * h, 2 * h * i, i * h, h, h]
    if arch.attention_bias:
        layer.append(q + 2 * kv)
    root = [arch.embedding_params] * (1 if arch.tied_embeddings else 2) + [h]
    return layer * arch.num_layers + root


def cuda_segments(sizes: list[int]) -> list[int]:
    """The CUDA caching allocator's segments (bytes) holding tensors of `sizes` bytes allocated
    one after another: a large tensor's own segment rounded up to 2 MiB; 1-10 MiB tensors packed
    into 20 MiB segments, small ones into 2 MiB segments (first fit, in order)."""
    segments = [ceil_div(s, ROUND_LARGE) * ROUND_LARGE for s in sizes if s > MID_ALLOC]
    for lo, hi, seg in ((SMALL_ALLOC, MID_ALLOC, MID_SEGMENT), (0, SMALL_ALLOC, SMALL_SEGMENT)):
        free = 0
        for s in (s for s in sizes if lo < s <= hi):
            if s > free:
                segments.append(seg)
                free = seg
            free -= s
    return segments


def level1_backup_bytes(arch: Arch, vllm_bytes: int) -> int:
    """Pinned host memory a rank keeps after vLLM's first level-1 sleep: one block per segment of
    its weights, each rounded up to a power of two."""
    return sum(pow2(s) for s in cuda_segments([n * vllm_bytes for n in vllm_tensors(arch)]))


@dataclass(frozen=True)
class HostTerm:
    name: str
    per_rank: int  # bytes on every rank of the node
    once: int = 0  # bytes on one rank of the node (rank 0's checkpoint read)
    startup_only: bool = False  # gone before the first validation (the checkpoint read)
    steady_only: bool = False  # only after the first validation (the level-1 backups)


@dataclass(frozen=True)
class HostPlan:
    terms: tuple[HostTerm, ...]
    ranks_per_node: int
    nodes: int
    node_bytes: int  # the node's memory (0: not known: nothing is compared)

    def node_total(self, startup: bool) -> int:
        kept = [t for t in self.terms if not (t.steady_only if startup else t.startup_only)]
        return sum(t.per_rank * self.ranks_per_node + t.once for t in kept)

    @property
    def peak(self) -> int:
        return max(self.node_total(True), self.node_total(False))

    @property
    def limit(self) -> int:
        return int(self.node_bytes * (1 - MARGIN))

    @property
    def fits(self) -> bool:
        return not self.node_bytes or self.peak <= self.limit


def offload_terms(arch: Arch, ranks: int, weight_bytes: int, mode: Offload) -> list[HostTerm]:
    """The offloaded state of one rank (see the module's docstring)."""
    shards = [ceil_div(n, ranks) for n in hf_tensors(arch)]
    if mode.params_on_host:
        pinned = 2 * sum(pow2(weight_bytes * n) for n in shards)
        return [
            HostTerm("weights + gradients (pinned shards)", pinned),
            HostTerm("AdamW moments (pageable)", 2 * weight_bytes * sum(shards)),
        ]
    if mode.host_adamw:
        return [HostTerm("HostAdamW moments (one pinned buffer)", pow2(8 * sum(shards)))]
    return []


def lora_offload_terms(arch: Arch, x: PlanInputs) -> list[HostTerm]:
    """The offloaded state of one rank that trains a LoRA adapter (plan/lora.py): the optimizer
    holds the adapter's parameters only. offload=optimizer: HostAdamW's one pinned buffer of the
    adapter's two fp32 moments (8 A/N, rounded up once); offload=all: FSDP2 pins every shard, the
    frozen base's in the compute dtype (no gradient) and the adapter's in w with their gradients,
    each tensor rounded up on its own, and AdamW's moments of the adapter stay pageable."""
    adapter = [ceil_div(n, x.ranks) for n in lora.adapter_tensors(arch, x.lora_rank, x.lora_targets)]
    if x.offload.params_on_host:
        base = sum(pow2(x.compute_bytes * ceil_div(n, x.ranks)) for n in hf_tensors(arch))
        pinned = base + 2 * sum(pow2(x.weight_bytes * n) for n in adapter)
        return [
            HostTerm("frozen base + adapter, its gradients (pinned shards)", pinned),
            HostTerm("adapter AdamW moments (pageable)", 2 * x.weight_bytes * sum(adapter)),
        ]
    if x.offload.host_adamw:
        return [HostTerm("HostAdamW adapter moments (one pinned buffer)", pow2(8 * sum(adapter)))]
    return []


def plan_host(arch: Arch, x: PlanInputs) -> HostPlan:
    """Host memory per node of a GPU run of `x.ranks` ranks, `x.ranks_per_node` to a node."""
    per_node = max(1, min(x.ranks_per_node or x.ranks, x.ranks))
    if x.lora_rank:
        terms = lora_offload_terms(arch, x)
    else:
        terms = offload_terms(arch, x.ranks, x.weight_bytes, x.offload)
    if x.level1_backups:
        terms.append(
            HostTerm(
                "vLLM level-1 sleep backups (pinned)",
                level1_backup_bytes(arch, x.vllm_bytes),
                steady_only=True,
            )
        )
    terms += [
        HostTerm("process (assumed)", PROCESS_BYTES),
        HostTerm(
            "rank 0's checkpoint read (start-up)", 0, once=arch.params * x.weight_bytes, startup_only=True
        ),
    ]
    return HostPlan(tuple(terms), per_node, ceil_div(x.ranks, per_node), x.node_bytes)
