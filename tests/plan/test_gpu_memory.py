"""On a GPU: the plan's backward and optimizer-step columns against torch's measured peaks.

One rank wrapped as the trainer wraps a one-GPU run (a one-rank NCCL group and FSDP2: what the plan
counts for a GPU, PlanInputs.fsdp), a Qwen2 body with the real Qwen2.5 vocabulary, random weights
in bf16, the trainer's forward (chunked log-prob head, entropy on), AdamW. The plan
must not underestimate (it is what refuses runs), and should not overestimate by more than 2x.
Skipped without CUDA (the `gpu` marker); the numbers are printed for the record (pytest -s).
Not run yet: written on a machine without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from exgrpo_cli.parallel.placement import NO_OFFLOAD
from exgrpo_cli.plan.arch import arch_from_config_json
from exgrpo_cli.plan.engines import ENGINE_MEMORY
from exgrpo_cli.plan.memory import BACKWARD, STEP, GiB, PlanInputs, plan_memory
from exgrpo_cli.policy.forward import forward_logprobs, pack

CONFIG = dict(
    model_type="qwen2",
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=4,
    num_attention_heads=16,
    num_key_value_heads=4,
    vocab_size=151936,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
)
ROWS, PROMPT, RESPONSE = 4, 128, 896  # equal lengths: no padding, sdpa's flash kernel


def _planned(checkpointing: bool, phase: int) -> int:
    arch = arch_from_config_json(dict(CONFIG), "test")
    x = PlanInputs(
        ranks=1,
        device="cuda",
        device_bytes=torch.cuda.get_device_properties(0).total_memory,
        weight_bytes=2,
        mixed_bytes=0,
        offload=NO_OFFLOAD,
        checkpointing=checkpointing,
        token_budget=ROWS * (PROMPT + RESPONSE),
        seq_tokens=PROMPT + RESPONSE,
        engine=ENGINE_MEMORY["hf"],
        vllm_share=0.0,
        vllm_sleep=False,
        vllm_max_len=PROMPT + RESPONSE,
        rollout_sequences=1,
        attention="flash",
    )
    # the measured peaks hold the trainer's allocations only: no engine, no CUDA context
    terms = plan_memory(arch, x).terms
    return sum(t.bytes[phase] for t in terms if not t.name.startswith(("HF", "CUDA")))


@pytest.mark.gpu
@pytest.mark.parametrize("checkpointing", [True, False], ids=["checkpointing", "no-checkpointing"])
def test_measured_peaks_are_within_the_plan(checkpointing: bool) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from exgrpo_cli.parallel.fsdp import close_distributed, init_distributed, wrap_fsdp2
    from exgrpo_cli.policy.model import enable_checkpointing

    torch.manual_seed(0)
    cfg = Qwen2Config(**{k: v for k, v in CONFIG.items() if k != "model_type"})
    cfg._attn_implementation = "sdpa"
    parallel = init_distributed(device="cuda")  # the trainer's one-GPU run: a one-rank NCCL group
    model = Qwen2ForCausalLM(cfg).to("cuda", torch.bfloat16)
    enable_checkpointing(model, checkpointing)  # the trainer's kind (non-reentrant)
    model = wrap_fsdp2(model, parallel)  # FSDP2 on one rank, as run/setup.py wraps it
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    prompts = [list(range(1, PROMPT + 1))] * ROWS
    responses = [list(range(7, 7 + RESPONSE))] * ROWS
    batch = pack(prompts, responses, list(range(ROWS)), 0, torch.device("cuda"))

    def backward() -> None:
        logp, ent = forward_logprobs(model, batch, with_entropy=True)
        assert ent is not None
        (-(logp.sum()) - 0.001 * ent.sum()).backward()

    backward()  # a first step creates AdamW's moments
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    backward()
    torch.cuda.synchronize()
    measured_backward = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    optimizer.step()
    torch.cuda.synchronize()
    measured_step = torch.cuda.max_memory_allocated()
    for name, measured, planned in (
        ("backward", measured_backward, _planned(checkpointing, BACKWARD)),
        ("step", measured_step, _planned(checkpointing, STEP)),
    ):
        print(f"{name}: measured {measured / GiB:.3f} GiB, planned {planned / GiB:.3f} GiB")
        assert measured <= planned, f"{name}: the plan underestimates"
        assert planned <= 2 * measured, f"{name}: the plan is more than twice the measured peak"
    close_distributed()
