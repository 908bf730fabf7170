"""The GPU acceptance check's update, generate and pytest sections (scripts/gpu_check.py runs
each in its own process), with the update's helpers: the memory plan of the GPU run
(Qwen2.5-Math-7B on one device) and the offload mode it picks, and the train step's update as the
trainer sets it up (algo's defaults, the trainer's optimizer) on one batch of random tokens.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpu_check_context import (
    REPO,
    TINY,
    Context,
    Sizes,
    build_policy,
    child_env,
    gib,
    host_memory_bytes,
    local,
    sampling_prompts,
)
from gpu_check_plan import (
    DRY_HOST_GIB,
    HOST_SHARE,
    Choice,
    GiB,
    attention_kind,
    available_host_bytes,
    choose_run,
    machines,
    phase_bytes,
    plan_arch,
    plan_inputs,
    plan_record,
    update_config,
    update_phases_bytes,
)

if TYPE_CHECKING:
    import torch

    from exgrpo_cli.plan.memory import Plan
    from exgrpo_cli.replay.mixing import MixedBatch


# ============================================================================ the update's helpers
def host_size(ctx: Context) -> int:
    """The host memory the GPU run is sized and guarded for: --host-gib when given (the machine's
    size: on a VM whose memory grows after boot, MemAvailable at the start says less than the run
    will have), else MemAvailable now; a dry run without --host-gib plans the lent machines' 128
    GiB. MemTotal and MemAvailable go into the report either way."""
    from exgrpo_cli.host import MEMINFO, proc_bytes

    total, available = proc_bytes(MEMINFO, "MemTotal"), proc_bytes(MEMINFO, "MemAvailable")
    given = ctx.args.host_gib
    if given is not None:
        size, source = int(given * GiB), "--host-gib"
    elif ctx.dry:
        size, source = int(DRY_HOST_GIB * GiB), f"the dry run's default, {DRY_HOST_GIB:g} GiB"
    else:
        size, source = available_host_bytes(), "MemAvailable"
    ctx.record(
        host_mem_total_bytes=total, host_mem_available_bytes=available, host_bytes=size, host_source=source
    )
    return size


def gpu_run_choice(ctx: Context) -> Choice:
    """The GPU run's shape and offload (gpu_check_plan.choose_run) for this device and the host
    (`host_size`); a dry run plans the device of --device-gib (its toy model then applies the
    offload mode)."""
    import torch

    from exgrpo_cli.policy.model import attn_implementation

    impl = attn_implementation("auto", torch.device("cuda"))  # flash_attn installed or not
    return choose_run(ctx.device_bytes, host_size(ctx), attention_kind(impl), ctx.args.offload)


def guard_host(ctx: Context, need: int) -> None:
    """Stop before building when the offloaded state (as torch pins it) and the process would not
    fit the host (`host_size`): pinning past it would swap or wake the OOM killer. A host size
    given by --host-gib above what is available now is said on stdout, not refused."""
    host = host_size(ctx)
    ctx.record(host_need_bytes=need, host_available_bytes=host)
    fits = need <= HOST_SHARE * host
    ctx.check("host memory holds the offloaded state", fits)
    now = ctx.result.get("host_mem_available_bytes")
    if fits and now and need > HOST_SHARE * now and not ctx.dry:  # a dry run's toy pins nothing of it
        print(
            f"warning: the update pins {gib(need)}, over 90% of the {gib(now)} available now "
            f"(sized for {ctx.result['host_source']}: {gib(host)})",
            flush=True,
        )
    if not fits:
        raise MemoryError(
            f"offload={ctx.result.get('offload')} needs {gib(need)} of host memory with {gib(host)} "
            f"({ctx.result['host_source']}): the update is not run"
        )


def update_plan(sizes: Sizes, device: torch.device) -> Any:
    """The update's settings: algo's defaults (exgrpo loss, Dr.GRPO, clip 0.2, entropy bonus
    0.001, grad clip 1), one update, the device's token budget."""
    from exgrpo_cli.algo.aggregation import drgrpo
    from exgrpo_cli.algo.losses import ExgrpoLoss
    from exgrpo_cli.config.schema import AlgoConfig
    from exgrpo_cli.policy.forward import token_budget
    from exgrpo_cli.step.update import UpdatePlan

    a = AlgoConfig()
    return UpdatePlan(
        loss=ExgrpoLoss(clip_eps=a.clip_eps, beta=None),
        aggregation=drgrpo,
        entropy_coef=a.entropy_coef,
        importance_correction=True,
        max_response_tokens=sizes.response_tokens,
        updates=1,
        micro_batch_tokens=token_budget(sizes.micro_batch_tokens, device),
        grad_clip=a.grad_clip,
        skip_grad_norm_above=float("inf"),
    )


def update_batch(sizes: Sizes, vocab: int) -> tuple[MixedBatch, torch.Tensor]:
    """One question, `rows` responses of random tokens, rewards 1, 0, 1, ... (advantages +-)."""
    import numpy as np

    from exgrpo_cli.algo.advantages import group_advantages
    from exgrpo_cli.data.types import Question
    from exgrpo_cli.replay.mixing import Group, Response, build_mixed_batch

    rng = np.random.default_rng(0)
    prompt = rng.integers(3, vocab, sizes.prompt_tokens).tolist()
    responses = [
        Response(rng.integers(3, vocab, sizes.response_tokens).tolist(), None, reward=float(i % 2 == 0))
        for i in range(sizes.rows)
    ]
    batch = build_mixed_batch([Group(Question("gpu-check", "", ""), prompt, responses)])
    return batch, group_advantages(batch.rewards, batch.group_index)


def make_optimizer(model: torch.nn.Module, offload: str) -> torch.optim.Optimizer:
    """The trainer's optimizer (run/setup.make_optimizer): HostAdamW under offload=optimizer."""
    from exgrpo_cli.config.schema import ExgrpoConfig
    from exgrpo_cli.parallel.placement import OFFLOAD_MODES
    from exgrpo_cli.run.setup import make_optimizer as trainer_optimizer

    cfg = ExgrpoConfig()
    cfg.algo.lr = 1e-6
    return trainer_optimizer(cfg, model, OFFLOAD_MODES[offload])


# ============================================================================ sections
def section_update(ctx: Context) -> None:
    from exgrpo_cli.plan.memory import plan_memory
    from exgrpo_cli.policy.forward import output_head
    from exgrpo_cli.step.update import policy_update

    ctx.stage("plan")
    choice = gpu_run_choice(ctx)
    mode, gpu_plan = choice.offload, choice.plan
    print(f"chose {choice.line()}", flush=True)
    ctx.record(
        gpu_run_offload=mode,
        gpu_run_layers=choice.layers,
        gpu_run_plan=plan_record(gpu_plan),
        gpu_run_params=gpu_plan.arch.params,
        gpu_run_choice=choice.record(),
    )
    print(plan_rows(gpu_plan), flush=True)
    ctx.check("the GPU run's shape and offload fit the device and the host", choice.fits)
    if ctx.dry:  # the lent machines' limits, simulated: each must get a configuration that fits
        kinds = machines()
        for name, c in kinds.items():
            print(f"{name}: {c.line()}{'' if c.fits else ': NOTHING FITS'}", flush=True)
            ctx.check(f"{name}: a shape and offload that fit", c.fits)
        ctx.record(machines={name: c.record() for name, c in kinds.items()})
    hf_config = update_config(ctx.sizes, choice.layers)
    arch = plan_arch(hf_config, "gpu_check")
    if ctx.dry:  # the toy's own plan, on this CPU (reported, not compared)
        from exgrpo_cli.parallel.placement import OFFLOAD_MODES
        from exgrpo_cli.policy.model import attn_implementation

        x = plan_inputs(
            "cpu", host_memory_bytes(), ctx.sizes, attention_kind(attn_implementation("auto", ctx.device))
        )
        plan = plan_memory(arch, replace(x, offload=OFFLOAD_MODES[mode]))
    else:
        plan = gpu_plan
    ctx.record(
        offload=mode, plan=plan_record(plan), plan_update_bytes=None if ctx.dry else update_phases_bytes(plan)
    )
    # before anything is built: what the chosen mode pins (the GPU run's, on a dry run too)
    guard_host(ctx, choice.host_bytes)

    ctx.stage("build")
    ctx.distributed()
    t0 = time.perf_counter()
    model = build_policy(ctx, hf_config, mode)
    ctx.meter.sync()
    params = sum(local(p).numel() for p in model.parameters())
    ctx.record(build_s=time.perf_counter() - t0, params=params, plan_params=arch.params)
    ctx.check("the plan counts the model's parameters", params == arch.params)
    ctx.check("gradient checkpointing on", model.is_gradient_checkpointing)
    ctx.check("chunked log-prob head", output_head(model) is not None)
    optimizer = make_optimizer(model, mode)
    ctx.record(optimizer=type(optimizer).__name__)
    batch, adv = update_batch(ctx.sizes, hf_config.vocab_size)
    settings = update_plan(ctx.sizes, ctx.device)
    tokens = sum(len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids))
    ctx.record(rows=len(batch), tokens=tokens, micro_batch_tokens=settings.micro_batch_tokens)

    updates: list[dict[str, Any]] = []
    phases = measure_phases(ctx, optimizer)
    for i in range(ctx.sizes.updates):
        ctx.stage(f"update {i + 1}/{ctx.sizes.updates}")
        ctx.meter.empty_cache()  # the forward/backward from an emptied cache, as the step below
        ctx.meter.reset()
        t0 = time.perf_counter()
        res = policy_update(model, optimizer, batch, adv, settings, pad_id=0, parallel=ctx.parallel)
        ctx.meter.sync()
        took = time.perf_counter() - t0
        updates.append(
            {
                "seconds": took,
                "tokens_per_s": tokens / took,
                "peak_bytes": ctx.meter.peak(),
                **{f"{phase}_{kind}": value for phase, got in phases.items() for kind, value in got.items()},
                "loss": res.loss_total,
                "grad_norm": res.grad_norms[-1] if res.grad_norms else float("nan"),
                "skipped": res.skipped,
                "entropy_mean": res.entropy_sum / sum(len(r) for r in batch.response_ids),
            }
        )
        ctx.record(updates=updates, peak_bytes=max(u["peak_bytes"] for u in updates), meter=ctx.meter.kind)
    ctx.check(
        "finite losses and gradient norms",
        all(math.isfinite(u["loss"]) and math.isfinite(u["grad_norm"]) for u in updates),
    )
    ctx.check("no update skipped", all(u["skipped"] == 0 for u in updates))
    if not ctx.dry:
        check_phases(ctx, plan, updates)


def measure_phases(ctx: Context, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, int | None]]:
    """Peaks of the forward/backward stretch and of the optimizer step apart (allocated and
    reserved), filled in by a wrapper around `optimizer.step` at every update; each phase starts
    from an emptied cache (reserved = what is live), so each reserved peak is that phase's own."""
    phases: dict[str, dict[str, int | None]] = {}
    step = optimizer.step

    def measured_step(*args: Any, **kwargs: Any) -> Any:
        m = ctx.meter
        phases["backward"] = {"allocated": m.peak(), "reserved": m.peak_reserved()}
        # the backward's freed activations stay reserved in torch's cache until emptied: without
        # this the step's reserved peak would be the backward's, not the step's
        m.empty_cache()
        m.reset()
        out = step(*args, **kwargs)
        phases["step"] = {"allocated": m.peak(), "reserved": m.peak_reserved()}
        return out

    optimizer.step = measured_step  # type: ignore[method-assign]
    return phases


def plan_rows(plan: Plan) -> str:
    """The chosen plan's terms in the update's phases, GiB, as a small table (stdout)."""
    from exgrpo_cli.plan.memory import BACKWARD, BWD_END, STEP

    lines = [f"  {'plan, GiB per GPU':<40}{'backward':>10}{'bwd end':>10}{'step':>10}"]
    for t in plan.terms:
        if any(t.bytes[p] for p in (BACKWARD, BWD_END, STEP)):
            lines.append(
                f"  {t.name:<40}" + "".join(f"{t.bytes[p] / GiB:>10.2f}" for p in (BACKWARD, BWD_END, STEP))
            )
    return "\n".join(lines)


def check_phases(ctx: Context, plan: Plan, updates: list[dict[str, Any]]) -> None:
    """Each measured phase against the plan's, allocated and reserved (the allocator's cached,
    fragmented blocks are GPU memory too), every update (the first creates AdamW's state)."""
    from exgrpo_cli.plan.memory import BACKWARD, BWD_END, STEP

    planned = {"backward": phase_bytes(plan, (BACKWARD, BWD_END)), "step": phase_bytes(plan, (STEP,))}
    ctx.record(plan_phase_bytes=planned)
    for phase, limit in planned.items():
        for kind in ("allocated", "reserved"):
            worst = max(int(u.get(f"{phase}_{kind}") or 0) for u in updates)
            ctx.check(f"{phase} peak {kind} <= the plan's {phase} phase", 0 < worst <= limit)
    planned_all = update_phases_bytes(plan)
    ctx.record(plan_over_measured=planned_all / max(ctx.result["peak_bytes"], 1))


def section_generate(ctx: Context) -> None:
    from transformers import AutoTokenizer

    from exgrpo_cli.rollout.base import SamplingSpec
    from exgrpo_cli.rollout.hf import HFEngine

    ctx.stage("plan")
    choice = gpu_run_choice(ctx)
    mode = choice.offload
    ctx.record(offload=mode, layers=choice.layers)
    guard_host(ctx, choice.host_bytes)
    ctx.stage("build")
    ctx.distributed()
    hf_config = update_config(ctx.sizes, choice.layers)
    model = build_policy(ctx, hf_config, mode)
    tok = AutoTokenizer.from_pretrained(TINY)
    engine = HFEngine(model, tok)
    s = ctx.sizes
    prompts = sampling_prompts(
        s.gen_prompts, s.gen_prompt_tokens, min(hf_config.vocab_size, len(tok)), seed=1
    )
    ctx.stage("warm-up")
    engine.generate(prompts[:2], [1, 1], SamplingSpec(1.0, 1.0, 8, seed=0))
    ctx.stage(f"generate {s.gen_prompts} x {s.gen_new_tokens} tokens")
    ctx.meter.reset()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, [1] * len(prompts), SamplingSpec(1.0, 1.0, s.gen_new_tokens, seed=1))
    ctx.meter.sync()
    took = time.perf_counter() - t0
    tokens = sum(len(o.response_ids) for o in outs)
    ctx.record(
        sequences=len(outs),
        tokens=tokens,
        seconds_generate=took,
        tokens_per_s=tokens / took,
        peak_bytes=ctx.meter.peak(),
        meter=ctx.meter.kind,
    )
    ctx.check("one rollout per prompt", len(outs) == len(prompts))
    ctx.check(
        "a finite log-prob per token",
        all(o.logprobs is not None and len(o.logprobs) == len(o.response_ids) for o in outs)
        and all(math.isfinite(v) for o in outs for v in (o.logprobs or [])),
    )


PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def section_pytest(ctx: Context) -> None:
    ctx.stage("pytest -m gpu -q")
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    print(out[-6000:], flush=True)
    last = next((ln for ln in reversed(out.strip().splitlines()) if PYTEST_COUNTS.search(ln)), "")
    counts = {kind: int(n) for n, kind in PYTEST_COUNTS.findall(last)}
    ctx.record(returncode=proc.returncode, summary=last.strip("= "), counts=counts, command=" ".join(cmd[1:]))
    ctx.check("pytest -m gpu exits 0", proc.returncode == 0)
