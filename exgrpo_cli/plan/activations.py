"""Bytes per token and per layer: what one micro-batch token costs the update (activations kept
for the backward, the backward's working set, the chunked log-prob head) and the KV cache per
token, from the architecture alone.

Where it sits: the per-token factors of the memory plan (plan/memory.py multiplies them by the
token budget and the sequences of a phase), before any weights load. The per-layer figures are
measured exactly on transformers' Qwen2 in tests/plan/test_activations.py; the backward's working
set is derived.
"""

from __future__ import annotations

from exgrpo_cli.plan.arch import Arch

# Copies of the trainer's constants (tests/plan/test_memory.py keeps them equal) so that planning
# never imports torch:
LOGIT_CHUNK_BYTES = 256 * 2**20  # policy/forward.py: fp32 [chunk x V] logits of the chunked head
LOGIT_TEMPS = 6  # fp32 [chunk x V] tensors alive at once in the chunked head's backward


def layer_activation_bytes(arch: Arch, c: int, attention: str = "flash", seq: int = 0) -> int:
    """Bytes autograd keeps per token for one decoder layer (forward with gradients, no
    checkpointing), compute dtype c. Measured exactly on transformers' Qwen2 (tests/plan):
      two RMSNorms        2 (4H + 4 + cH): fp32 upcast of the input, 1/rms, the normalised input
      their outputs       2 cH: the inputs of q/k/v and of gate/up
      q after RoPE, and the attention output   2 c q
      k after RoPE, and v                      2 c kv
      softmax log-sum-exp                      4 nh (fp32, per head)
      MLP                 4 cI: gate, silu(gate), up, their product
    = 8H + 8 + 4cH + 2cq + 2ckv + 4nh + 4cI with flash-attention-2 (measured through sdpa on
    unpadded rows, whose flash kernel keeps the same q, k, v, output and log-sum-exp; HF's
    flash-attention-2 un-pads padded rows first, copies this does not count).
    sdpa on padded rows (the trainer's micro-batches): K and V repeated to every head, and the
    [S]-wide mask row kept per layer: + 2c(q - kv) + cS.
    eager: K and V repeated, the softmax's fp32 output and its cast: + 2c(q - kv) - 4nh + (4 + c)nh S
    (4 nh S when c = 4)."""
    h, i, q, kv, nh = arch.hidden_size, arch.intermediate_size, arch.q_dim, arch.kv_dim, arch.num_heads
    base = 8 * h + 8 + 4 * c * h + 2 * c * q + 2 * c * kv + 4 * nh + 4 * c * i
    if attention == "sdpa":
        return base + 2 * c * (q - kv) + c * seq
    if attention == "eager":
        probs = 4 if c == 4 else 4 + c
        return base + 2 * c * (q - kv) - 4 * nh + probs * nh * seq
    return base


def top_activation_bytes(arch: Arch, c: int) -> int:
    """Bytes kept per token outside the layers (measured with tests/plan), every token counted as
    a response token (an upper bound): the final RMSNorm (4H + 4 + cH), its output (cH, kept by
    the one-position projection of the model's own forward), the response's final hidden states
    the chunked head keeps (cH), the input ids (8), the targets (8) and the response mask (1),
    RoPE's cos and sin (2 c head_size)."""
    h = arch.hidden_size
    return 4 * h + 4 + 3 * c * h + 17 + 2 * c * arch.head_size


def backward_working_bytes(arch: Arch, c: int) -> int:
    """Bytes per token the backward of one layer adds to what is kept (derived, not measured):
    the MLP's gradients w.r.t. its product, silu(gate) and up (3 cI), and the gradients of the
    layer's output and input (2 cH)."""
    return 3 * c * arch.intermediate_size + 2 * c * arch.hidden_size


def activation_bytes_per_token(
    arch: Arch, c: int, *, checkpointing: bool, attention: str = "flash", seq: int = 0
) -> int:
    """Peak bytes per micro-batch token at the start of a backward.
    With gradient checkpointing: the layers' inputs kept (L cH), one layer recomputed (its
    activations), its backward's working set, and the top.
    Without: every layer's activations (L x layer), the working set, and the top."""
    layer = layer_activation_bytes(arch, c, attention, seq)
    kept = arch.num_layers * c * arch.hidden_size + layer if checkpointing else arch.num_layers * layer
    return kept + backward_working_bytes(arch, c) + top_activation_bytes(arch, c)


def chunk_tokens(vocab_size: int) -> int:
    """policy/forward.py's chunk of the log-prob head: ~LOGIT_CHUNK_BYTES of fp32 logits."""
    return max(16, LOGIT_CHUNK_BYTES // (4 * max(vocab_size, 1)))


def logit_chunk_bytes(arch: Arch, tokens: int) -> int:
    """The chunked head's temporaries: LOGIT_TEMPS fp32 [chunk x V] tensors (logits, log-probs,
    probabilities, the logits' gradient and the entropy's terms) in its backward, a chunk being
    at most the micro-batch's `tokens`; no [tokens x V] tensor exists."""
    return LOGIT_TEMPS * min(chunk_tokens(arch.vocab_size), tokens) * arch.vocab_size * 4


def kv_bytes_per_token(arch: Arch, dtype_bytes: int) -> int:
    """KV cache per token: K and V of every layer, 2 L kv bytes."""
    return 2 * arch.num_layers * arch.kv_dim * dtype_bytes
