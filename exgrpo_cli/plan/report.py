"""The plan as the user sees it: a table per phase, its notes, the verdict, and the refusal.

Where it sits: `commands/train.py` calls `check_memory` after the config is validated and before
anything loads: in dry runs (`trainer.dry_run=true`, for `trainer.plan_devices` or the visible
devices) and at the start of every GPU run. A plan that does not fit prints the overrides that do
(each planned again) and raises `PlanDoesNotFit` (exit 2) with the numbers and those overrides.
"""

from __future__ import annotations

from collections.abc import Callable

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.errors import UsageError
from exgrpo_cli.plan.arch import Arch, preset_archs
from exgrpo_cli.plan.fixes import Fix, lora_fixes, more_devices, runtime_fixes, smaller_models
from exgrpo_cli.plan.host import MARGIN as HOST_MARGIN
from exgrpo_cli.plan.host import level1_backup_bytes
from exgrpo_cli.plan.inputs import Devices, inputs_from_config
from exgrpo_cli.plan.lora import adapter_params, uncounted
from exgrpo_cli.plan.memory import (
    CUDA_CONTEXT_BYTES,
    PHASES,
    TORCH_WORKSPACE_BYTES,
    VLLM_CUDA_GRAPH_BYTES,
    VLLM_NON_TORCH_BYTES,
    GiB,
    Plan,
    PlanInputs,
    plan_memory,
)
from exgrpo_cli.plan.settings import MARGIN

DTYPE = {4: "fp32", 2: "bf16"}
ATTENTION = {"flash": "flash-attention-2", "sdpa": "sdpa attention", "eager": "eager attention"}


class PlanDoesNotFit(UsageError):
    """The run would run out of device memory: the message has the numbers and overrides that fit."""


def _g(n: int) -> str:
    return f"{n / GiB:.2f}"


def settings_line(x: PlanInputs, arch: Arch) -> str:
    if x.fsdp:
        shard = f"FSDP2 over {x.ranks} rank{'s' if x.ranks > 1 else ''}"
    else:
        shard = "one rank, no FSDP (the whole state on the device)"
    parts = [
        shard,
        f"{DTYPE.get(x.weight_bytes, '?')} weights, {DTYPE.get(x.compute_bytes, '?')} compute",
        x.offload.label,
        "gradient checkpointing" if x.checkpointing else "no gradient checkpointing",
        f"micro-batches of {x.micro_batch_tokens} tokens (sequences of {x.seq_tokens})",
        ATTENTION.get(x.attention, x.attention),
    ]
    if x.lora_rank:
        parts.append(lora_setting(arch, x))
    engine = x.engine
    if engine.needs_trainer_model:
        parts.append(f"{engine.label} rollouts")
    else:
        sleep = "asleep" if x.vllm_sleep else "awake"
        parts.append(f"{engine.label} rollouts (u={x.vllm_share:g}, {sleep} during the update)")
    return "; ".join(parts)


def format_plan(plan: Plan, devices: Devices, model_path: str) -> str:
    """The plan's table (GiB per device, a column per phase), with its header and notes."""
    a, x = plan.arch, plan.inputs
    per = "GPU" if x.device == "cuda" else "rank (host)"
    lines = [
        f"memory plan: {model_path}, {count(a.params)} parameters (numbers from {a.source})",
        f"  devices: {devices.label}" + (" (trainer.plan_devices)" if devices.planned else ""),
        f"  {settings_line(x, a)}",
        "",
    ]
    width = max(len(t.name) for t in plan.terms) + 2
    lines.append(f"  {'GiB per ' + per:<{width}}" + "".join(f"{p:>11}" for p in PHASES))
    for t in plan.terms:
        lines.append(f"  {t.name:<{width}}" + "".join(f"{_g(b) if b else '-':>11}" for b in t.bytes))
    lines.append(f"  {'total':<{width}}" + "".join(f"{_g(b):>11}" for b in plan.totals))
    limit = f"limit ({100 * (1 - MARGIN):.0f}% of {x.device_bytes / GiB:.4g} GiB)"
    lines.append(f"  {limit:<{width}}" + f"{_g(x.limit):>11}" * len(PHASES))
    lines += host_lines(plan, width)
    notes = list(plan.notes)
    if x.lora_rank:
        notes.append(lora_note(a, x))
    if plan.host_bytes and plan.host is None:  # a GPU run's host rows count it, rounded as pinned
        notes.append(f"host memory: {_g(plan.host_bytes)} GiB per rank of offloaded state (pinned)")
    engine = x.engine
    if x.device == "cuda":
        notes.append(
            f"assumed, not measured: {CUDA_CONTEXT_BYTES / GiB:g} GiB of CUDA context and NCCL per process, "
            f"{TORCH_WORKSPACE_BYTES / GiB:g} GiB of torch's workspaces and live inputs"
            + (
                ""
                if engine.needs_trainer_model
                else f", {VLLM_NON_TORCH_BYTES / GiB:g} GiB of vLLM's memory outside torch, "
                f"{VLLM_CUDA_GRAPH_BYTES / GiB:g} GiB of its CUDA graphs"
            )
            + "; the backward's working set is derived; the saved activations and the state are exact"
        )
        if not engine.needs_trainer_model and x.vllm_sleep and not x.level1_backups:
            per_rank = level1_backup_bytes(a, x.vllm_bytes)
            per_node = per_rank * (plan.host.ranks_per_node if plan.host else 1)
            notes.append(
                "vLLM sleeps at level 2 after validation (rollout.validation_sleep_level=2): one more "
                f"weight sync per validation; level 1 would keep {_g(per_rank)} GiB per rank "
                f"({_g(per_node)} GiB per node) of pinned backups for the rest of the run"
            )
        if not engine.needs_trainer_model and x.vllm_sleep:
            notes.append(
                "with vLLM asleep the trainer must empty torch's cache (torch.cuda.empty_cache) "
                "before vLLM wakes, or the update's peak stays reserved through the rollout"
            )
    if notes:
        lines += ["  notes:", *[f"    - {n}" for n in notes]]
    return "\n".join(lines)


def lora_setting(arch: Arch, x: PlanInputs) -> str:
    """The settings line's LoRA part: rank, targets, adapter size, how vLLM gets it."""
    size = f" ({count(adapter_params(arch, x.lora_rank, x.lora_targets))} parameters)"
    sync = "" if x.engine.needs_trainer_model else f", rollout.lora_sync={x.lora_sync}"
    return f"LoRA rank {x.lora_rank} on {','.join(x.lora_targets)}{size}, the base frozen{sync}"


def lora_note(arch: Arch, x: PlanInputs) -> str:
    missing = uncounted(x.lora_targets, arch)
    return "LoRA (model.lora.rank) trains low-rank adapters, not the paper's full fine-tuning" + (
        f"; target modules the plan does not size (not counted): {', '.join(missing)}" if missing else ""
    )


def host_lines(plan: Plan, width: int) -> list[str]:
    """The host-memory rows of a GPU run: GiB per rank, and per node at start-up (rank 0 reads the
    checkpoint) and in the steady state (after the first validation), against the node's memory."""
    h = plan.host
    if h is None:
        return []
    n = h.ranks_per_node
    nodes = f", {h.nodes} nodes" if h.nodes > 1 else ""
    width = max(width, *(len(t.name) + 2 for t in h.terms))
    head = f"host GiB ({n} rank{'s' if n > 1 else ''} a node{nodes})"
    lines = ["", f"  {head:<{width}}" + "".join(f"{c:>11}" for c in ("per rank", "start-up", "steady"))]
    for t in h.terms:
        node = t.per_rank * n + t.once
        cells = (t.per_rank, 0 if t.steady_only else node, 0 if t.startup_only else node)
        lines.append(f"  {t.name:<{width}}" + "".join(f"{_g(b) if b else '-':>11}" for b in cells))
    totals = ("", _g(h.node_total(True)), _g(h.node_total(False)))
    lines.append(f"  {'node total':<{width}}" + "".join(f"{c:>11}" for c in totals))
    if h.node_bytes:
        limit = f"limit ({100 * (1 - HOST_MARGIN):.0f}% of {h.node_bytes / GiB:.4g} GiB)"
        verdict = "fits" if h.fits else "DOES NOT FIT"
        lines.append(f"  {limit:<{width}}{'':>11}" + f"{_g(h.limit):>11}" * 2 + f"   {verdict}")
    else:
        lines.append("  node memory not given (trainer.plan_host_gib=<GiB>): not compared")
    return lines


def host_problem(plan: Plan) -> str | None:
    h = plan.host
    if h is None or h.fits:
        return None
    when = "at start-up" if h.node_total(True) >= h.node_total(False) else "after the first validation"
    return (
        f"host memory: a node of {h.ranks_per_node} ranks needs {_g(h.peak)} GiB {when}, over "
        f"{_g(h.limit)} GiB ({100 * (1 - HOST_MARGIN):.0f}% of its {h.node_bytes / GiB:.4g} GiB)"
    )


def count(n: int) -> str:
    """A parameter count: 7.62B, 135M, 0.82M."""
    return f"{n / 1e9:.2f}B" if n >= 10**9 else f"{n / 1e6:.3g}M"


def verdict(plan: Plan) -> str:
    x = plan.inputs
    phase, peak = plan.peak
    of = f"{100 * (1 - MARGIN):.0f}% of {x.device_bytes / GiB:.4g} GiB"
    if plan.fits:
        return (
            f"fits: every phase within {_g(x.limit)} GiB ({of}); the largest, {phase}, needs {_g(peak)} GiB"
        )
    over = f"{phase} needs {_g(peak)} GiB per device, over {_g(x.limit)} GiB ({of})"
    if peak <= x.limit:
        over = f"peak {phase} {_g(peak)} GiB is within {_g(x.limit)} GiB"
    host = host_problem(plan)
    return "does not fit: " + "; ".join([over, *plan.problems, *([host] if host else [])])


def _fix_text(fix: Fix) -> str:
    phase, peak = fix.plan.peak
    what = " ".join(fix.overrides) if fix.overrides else fix.note
    note = f"; {fix.note}" if fix.note and fix.overrides else ""
    return f"{what}  (peak: {phase} {_g(peak)} GiB{note})"


def find_fixes(
    arch: Arch,
    x: PlanInputs,
    cfg: ExgrpoConfig,
    devices: Devices,
    verify: Callable[[tuple[str, ...]], Plan | None] | None = None,
) -> list[Fix]:
    """Runtime settings first, then more devices; LoRA adapters and a smaller GPU backbone only when
    neither fits."""
    fixes = runtime_fixes(arch, x, verify)
    gib_each = devices.bytes_each / GiB if devices.planned else None
    more = more_devices(arch, x, cfg.algo.questions_per_step, gib_each, verify)
    listed = [set(f.overrides) for f in fixes]
    if more is not None and not any(done <= set(more.overrides) for done in listed):
        fixes.append(more)  # unless its settings alone are a listed fix
    if not fixes:  # changes of the experiment, each labelled as one
        smaller = smaller_models(arch, x, [(n, a) for n, a, gpu in preset_archs() if gpu], verify)
        fixes = [*lora_fixes(arch, x, verify), *smaller]
    return fixes


def check_memory(
    cfg: ExgrpoConfig,
    arch: Arch,
    devices: Devices,
    *,
    echo: Callable[[str], None] = print,
    verify: Callable[[tuple[str, ...]], Plan | None] | None = None,
    refuse: bool = True,
) -> Plan:
    """Plan `cfg` on `devices` and show it through `echo`. When it does not fit (and `refuse`), show
    the overrides that do (`verify` plans each from a composed config) and raise `PlanDoesNotFit`."""
    x = inputs_from_config(cfg, devices)
    plan = plan_memory(arch, x)
    text = format_plan(plan, devices, cfg.model.path)
    if plan.fits or not refuse:
        echo(f"{text}\n  {verdict(plan)}")
        return plan
    fixes = find_fixes(arch, x, cfg, devices, verify)
    listed = "\n".join(f"    {i}. {_fix_text(f)}" for i, f in enumerate(fixes, 1))
    echo(
        f"{text}\n  {verdict(plan)}\n  overrides that fit (each planned again):\n{listed or '    none found'}"
    )
    suggestions = "; ".join(f"({i}) {_fix_text(f)}" for i, f in enumerate(fixes, 1))
    raise PlanDoesNotFit(
        f"the memory plan does not fit {devices.label}: {verdict(plan)[len('does not fit: ') :]}. "
        + (f"Overrides that fit: {suggestions}" if fixes else "No override found that fits.")
    )
