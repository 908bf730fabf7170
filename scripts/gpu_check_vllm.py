"""The GPU acceptance check's vllm section (scripts/gpu_check.py runs it in its own process): the
rollout engine of `rollout=vllm` started from a small random Qwen2 wrapped like the trainer's
policy, and the weight sync between them checked through log-probs (synced, stale after updates,
fresh after sleep + sync), with the memory `sleep` frees and vLLM's tokens/s against the HF
engine's. Skipped where vllm does not import.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_check_context import BF16_LOGP_TOL, TINY, Context, local, sampling_prompts
from gpu_check_sections import update_plan

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from exgrpo_cli.rollout.base import Rollout


def trainer_logprobs_diff(
    model: torch.nn.Module, prompts: list[list[int]], outs: list[Rollout], pad_id: int, device: torch.device
) -> tuple[float, float]:
    """Mean and max |engine - trainer| log-prob over the engine's sampled tokens."""
    import torch

    from exgrpo_cli.policy.forward import forward_logprobs, pack

    sb = pack(
        [prompts[o.prompt_index] for o in outs],
        [o.response_ids for o in outs],
        list(range(len(outs))),
        pad_id,
        device,
    )
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            lp, _ = forward_logprobs(model, sb)
    finally:
        model.train(was_training)
    diffs = [
        (lp[r, : len(o.response_ids)].float().cpu() - torch.tensor(o.logprobs or [])).abs()
        for r, o in enumerate(outs)
    ]
    flat = torch.cat(diffs)
    return float(flat.mean()), float(flat.max())


def small_model_folder(ctx: Context, folder: Path, tok: PreTrainedTokenizerBase) -> None:
    """A random small Qwen2 with the tiny model's tokenizer, saved as an HF folder (no download)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        **ctx.sizes.vllm_arch,
        vocab_size=len(tok),
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)


def section_vllm(ctx: Context) -> None:
    if importlib.util.find_spec("vllm") is None:
        ctx.not_proven("vllm is not importable here: the vLLM part did not run")
        return
    import torch
    from transformers import AutoTokenizer

    from exgrpo_cli.commands.compose import compose_train
    from exgrpo_cli.parallel.fsdp import wrap_fsdp2
    from exgrpo_cli.parallel.placement import OFFLOAD_MODES
    from exgrpo_cli.plan.memory import VLLM_CUDA_GRAPH_BYTES, VLLM_NON_TORCH_BYTES
    from exgrpo_cli.policy.model import load_model, load_tokenizer
    from exgrpo_cli.rollout.base import SamplingSpec
    from exgrpo_cli.rollout.hf import HFEngine
    from exgrpo_cli.rollout.vllm_engine import VLLMEngine
    from exgrpo_cli.step.update import policy_update

    s = ctx.sizes
    share = 0.3
    work = Path(tempfile.mkdtemp(prefix="gpu-check-vllm-"))
    ctx.stage("model folder")
    small_model_folder(ctx, work / "model", AutoTokenizer.from_pretrained(TINY))
    cfg = compose_train(
        [
            "rollout=vllm",
            f"model.path={work / 'model'}",
            "model.dtype=float32",
            f"trainer.fsdp_mixed_precision={'' if ctx.dry else 'bf16'}",
            f"rollout.gpu_memory_utilization={share}",
            "rollout.sleep_mode=true",
            f"model.max_prompt_tokens={s.gen_prompt_tokens}",
            f"model.max_response_tokens={s.vllm_new_tokens}",
            f"eval.max_new_tokens={s.vllm_new_tokens}",
            f"trainer.output_dir={work / 'run'}",
        ]
    )
    ctx.stage("trainer model")
    ctx.distributed()
    assert ctx.wrap_parallel is not None
    t = cfg.trainer
    model = wrap_fsdp2(
        load_model(cfg.model, torch.device("cpu")),
        ctx.wrap_parallel,
        mixed_precision=t.fsdp_mixed_precision or None,
        offload=OFFLOAD_MODES[t.offload],
    )
    tok = load_tokenizer(cfg.model)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    params = sum(local(p).numel() for p in model.parameters())
    ctx.stage("vLLM engine")
    t0 = time.perf_counter()
    engine = VLLMEngine.from_config(cfg, tok, model=model)
    ctx.record(engine_start_s=time.perf_counter() - t0, vllm_dtype="bfloat16" if not ctx.dry else "float32")
    try:
        vocab = len(tok)
        prompts = sampling_prompts(4, s.gen_prompt_tokens, vocab, seed=2)
        spec = SamplingSpec(1.0, 1.0, 32, seed=0)
        ctx.stage("log-probs after the first sync")
        outs = engine.generate(prompts, [4] * len(prompts), spec)
        synced, synced_max = trainer_logprobs_diff(model, prompts, outs, pad, ctx.device)
        ctx.record(diff_synced=synced, diff_synced_max=synced_max)
        ctx.check("synced log-probs within bf16 tolerance", synced < BF16_LOGP_TOL)

        ctx.stage("updates (the trainer moves on)")
        from exgrpo_cli.algo.advantages import group_advantages
        from exgrpo_cli.data.types import Question
        from exgrpo_cli.replay.mixing import Group, Response, build_mixed_batch

        groups = [Group(Question(f"q{i}", "", ""), p, []) for i, p in enumerate(prompts)]
        for k, o in enumerate(outs):
            groups[o.prompt_index].responses.append(Response(o.response_ids, o.logprobs, reward=float(k % 2)))
        batch = build_mixed_batch(groups)
        adv = group_advantages(batch.rewards, batch.group_index)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        plan = update_plan(replace(s, response_tokens=32, micro_batch_tokens=0), ctx.device)
        for _ in range(3):
            policy_update(model, optimizer, batch, adv, plan, pad_id=pad, parallel=ctx.parallel)
        outs = engine.generate(prompts, [4] * len(prompts), replace(spec, seed=1))
        stale, _ = trainer_logprobs_diff(model, prompts, outs, pad, ctx.device)
        ctx.record(diff_stale=stale)

        if ctx.meter.cuda and hasattr(engine, "sleep"):
            ctx.stage("sleep")
            torch.cuda.synchronize()
            free_awake = torch.cuda.mem_get_info()[0]
            engine.sleep()
            torch.cuda.synchronize()
            freed = torch.cuda.mem_get_info()[0] - free_awake
            share_bytes = int(share * int(ctx.result["device_bytes"]))
            # the plan's vllm_terms, roughly: weights in bf16, less the workspace's fixed part and the
            # CUDA graphs (which sleep does not free)
            kv = share_bytes - params * 2 - VLLM_NON_TORCH_BYTES - VLLM_CUDA_GRAPH_BYTES
            ctx.record(freed_bytes=freed, kv_share_bytes=kv, vllm_share_bytes=share_bytes)
            ctx.check("sleep frees at least the KV share", freed >= kv)
            if hasattr(engine, "wake_up"):
                engine.wake_up()
        else:
            ctx.record(freed_bytes=None, sleep="not measured: " + ("no sleep()" if ctx.meter.cuda else "CPU"))

        ctx.stage("sync and log-probs again")
        ctx.record(sync_s=engine.sync_weights(model))
        outs = engine.generate(prompts, [4] * len(prompts), replace(spec, seed=2))
        fresh, fresh_max = trainer_logprobs_diff(model, prompts, outs, pad, ctx.device)
        ctx.record(diff_fresh=fresh, diff_fresh_max=fresh_max)
        ctx.check("log-probs after sync within bf16 tolerance", fresh < BF16_LOGP_TOL)
        ctx.check("stale log-probs differ (the sync matters)", stale > 3 * max(fresh, 0.01))

        ctx.stage(f"tokens/s: {s.vllm_prompts} x {s.vllm_new_tokens} tokens, vLLM and HF")
        gen_prompts = sampling_prompts(s.vllm_prompts, s.gen_prompt_tokens, vocab, seed=3)
        gen_spec = SamplingSpec(1.0, 1.0, s.vllm_new_tokens, seed=3)
        for name, eng in (("vllm", engine), ("hf", HFEngine(model, tok))):
            eng.generate(gen_prompts[:2], [1, 1], SamplingSpec(1.0, 1.0, 8, seed=0))  # warm-up
            ctx.meter.sync()
            t0 = time.perf_counter()
            got = eng.generate(gen_prompts, [1] * len(gen_prompts), gen_spec)
            ctx.meter.sync()
            n = sum(len(o.response_ids) for o in got)
            ctx.record(**{f"{name}_tokens": n, f"{name}_tokens_per_s": n / (time.perf_counter() - t0)})
    finally:
        engine.close()
