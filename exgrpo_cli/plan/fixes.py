"""Overrides that make a plan fit: searched over the runtime settings, each re-planned.

Where it sits: after a plan that does not fit, before the run is refused. The search changes only
how the run uses memory, never the objective: vLLM's sleep during the update, gradient
checkpointing, a smaller token budget per micro-batch (down to one full sequence), offloading the
optimizer or the whole sharded state to the host, a smaller vLLM share; then, separately, more
devices of the same size; only when none of these fits, changes of the experiment, each said to
be one: LoRA adapters (model.lora.rank, not the paper's full fine-tuning) and smaller backbones
(presets with architecture numbers). Cheap changes come first; a combination is kept only when
none of its parts fits alone. When the caller can compose a whole config from overrides (`verify`,
the CLI's Hydra composition), every suggestion is planned again from that config, so the overrides
printed are the ones checked.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from exgrpo_cli.parallel.placement import OFFLOAD_MODES
from exgrpo_cli.plan.arch import Arch
from exgrpo_cli.plan.memory import Plan, PlanInputs, plan_memory

VLLM_SHARES = (0.4, 0.3, 0.2)  # smaller vLLM shares tried (a smaller KV cache: slower rollouts)
MAX_RANKS = 128
MAX_FIXES = 3
LORA_RANKS = (64, 32, 16, 8)  # model.lora.rank tried, the closest to full fine-tuning first
LORA_NOTE = "a change of method: LoRA adapters instead of full fine-tuning (not the paper's setting)"


@dataclass(frozen=True)
class Option:
    override: str  # a Hydra override, e.g. "rollout.sleep_mode=true"
    changes: dict[str, Any]  # the PlanInputs fields it changes
    cost: int  # what it costs the run (speed, rollout throughput): lower first


@dataclass(frozen=True)
class Fix:
    overrides: tuple[str, ...]
    plan: Plan
    note: str = ""  # what the overrides do not say (e.g. the devices it needs)


def knobs(x: PlanInputs, offload: bool = True) -> list[list[Option]]:
    """For each runtime setting that can still lower the memory, its options, cheapest first
    (`offload=False`: leave trainer.offload out)."""
    found: list[list[Option]] = []
    own_share = not x.engine.needs_trainer_model  # vLLM: its share of the GPU
    if own_share and x.device == "cuda" and not x.vllm_sleep:
        found.append([Option("rollout.sleep_mode=true", {"vllm_sleep": True}, 1)])
    if x.level1_backups:  # host memory only: vLLM's pinned level-1 backups after validation
        found.append([Option("rollout.validation_sleep_level=2", {"level1_backups": False}, 1)])
    if not x.checkpointing:
        found.append([Option("model.gradient_checkpointing=true", {"checkpointing": True}, 1)])
    budgets = []
    b = x.micro_batch_tokens // 2
    while b > x.seq_tokens:
        budgets.append(b)
        b //= 2
    if x.seq_tokens < x.micro_batch_tokens:
        budgets.append(x.seq_tokens)
    if budgets:
        found.append(
            [
                Option(f"algo.micro_batch_tokens={t}", {"token_budget": t}, 2 + i)
                for i, t in enumerate(budgets)
            ]
        )
    modes = list(OFFLOAD_MODES.values())  # least offloaded first: the ones after the run's own save memory
    offloads = modes[modes.index(x.offload) + 1 :] if offload else []
    if offloads:
        found.append(
            [Option(f"trainer.offload={o.name}", {"offload": o}, 4 + i) for i, o in enumerate(offloads)]
        )
    if own_share and x.device == "cuda":
        shares = [s for s in VLLM_SHARES if s < x.vllm_share - 1e-9]
        if shares:
            found.append(
                [
                    Option(f"rollout.gpu_memory_utilization={s:g}", {"vllm_share": s}, 5 + i)
                    for i, s in enumerate(shares)
                ]
            )
    return found


def runtime_fixes(
    arch: Arch,
    x: PlanInputs,
    verify: Callable[[tuple[str, ...]], Plan | None] | None = None,
    limit: int = MAX_FIXES,
    offload: bool = True,
) -> list[Fix]:
    """The cheapest combinations of runtime settings that fit. A combination is left out when a
    listed one uses only some of its settings, each at an option no more costly (it adds nothing)."""
    options = knobs(x, offload)
    candidates: list[tuple[int, int, dict[int, int]]] = []
    for combo in itertools.product(*[range(-1, len(opts)) for opts in options]):
        chosen = {k: i for k, i in enumerate(combo) if i >= 0}
        if chosen and plan_memory(arch, replace(x, **_changes(options, chosen))).fits:
            cost = sum(options[k][i].cost for k, i in chosen.items())
            candidates.append((len(chosen), cost, chosen))
    fixes: list[Fix] = []
    listed: list[dict[int, int]] = []
    for _, _, chosen in sorted(candidates, key=lambda c: (c[0], c[1])):
        if any(all(k in chosen and chosen[k] >= i for k, i in done.items()) for done in listed):
            continue
        overrides = tuple(options[k][i].override for k, i in chosen.items())
        plan = verify(overrides) if verify else plan_memory(arch, replace(x, **_changes(options, chosen)))
        if plan is None or not plan.fits:
            continue
        listed.append(chosen)
        fixes.append(Fix(overrides, plan))
        if len(fixes) == limit:
            break
    return fixes


def _changes(options: list[list[Option]], chosen: dict[int, int]) -> dict[str, Any]:
    return {field: value for k, i in chosen.items() for field, value in options[k][i].changes.items()}


def more_devices(
    arch: Arch,
    x: PlanInputs,
    questions_per_step: int,
    gib_each: float | None,
    verify: Callable[[tuple[str, ...]], Plan | None] | None = None,
) -> Fix | None:
    """The fewest devices of the same size (a power of two that divides the step's questions) on
    which the run fits as it is or with one more runtime setting (short of offloading); failing
    that, with the fewest devices and any settings. `gib_each`: the planned size, for a
    trainer.plan_devices override (None: visible devices, named in the note only)."""
    for most_changes in (1, len(knobs(x))):
        n = x.ranks * 2
        while n <= min(MAX_RANKS, questions_per_step):
            if questions_per_step % n == 0:
                fix = _fix_on(arch, x, n, gib_each, most_changes, verify)
                if fix is not None:
                    return fix
            n *= 2
    return None


def _fix_on(
    arch: Arch,
    x: PlanInputs,
    n: int,
    gib_each: float | None,
    most_changes: int,
    verify: Callable[[tuple[str, ...]], Plan | None] | None,
) -> Fix | None:
    sequences = -(-x.rollout_sequences * x.ranks // n)
    wider = replace(x, ranks=n, rollout_sequences=sequences)
    devices = (f"trainer.plan_devices={n}x{gib_each:g}",) if gib_each else ()
    note = f"{n} devices of this size (torchrun --nproc_per_node={n}, or more nodes)"
    plan = plan_memory(arch, wider)
    found = [Fix((), plan)] if plan.fits else runtime_fixes(arch, wider, None, limit=1, offload=False)
    for fix in found:
        if len(fix.overrides) > most_changes:
            continue
        overrides = devices + fix.overrides
        checked = verify(overrides) if verify and devices else fix.plan
        if checked is not None and checked.fits:
            return Fix(overrides, checked, note)
    return None


def smaller_models(
    arch: Arch,
    x: PlanInputs,
    presets: Sequence[tuple[str, Arch]],
    verify: Callable[[tuple[str, ...]], Plan | None] | None = None,
) -> list[Fix]:
    """Presets of smaller backbones that fit: with `verify`, planned from their own composed config
    (their recipe may change lengths), else with these settings."""
    fixes = []
    for name, other in sorted(presets, key=lambda p: p[1].params, reverse=True):
        if other.params >= arch.params:
            continue
        overrides = (f"model={name}",)
        plan = verify(overrides) if verify else plan_memory(other, x)
        if plan is not None and plan.fits:
            fixes.append(Fix(overrides, plan, "a smaller backbone: another experiment, not a memory setting"))
    return fixes[:1]


def lora_fixes(
    arch: Arch, x: PlanInputs, verify: Callable[[tuple[str, ...]], Plan | None] | None = None
) -> list[Fix]:
    """`model.lora.rank=<r>` (the largest of LORA_RANKS that fits, alone or with the cheapest
    runtime setting): the frozen base in the compute dtype, state for the adapter only. Labelled
    with LORA_NOTE: it changes what is trained, so it is never offered as a memory setting."""
    if x.lora_rank:
        return []
    for rank in LORA_RANKS:
        adapted = replace(x, lora_rank=rank)
        plan = plan_memory(arch, adapted)
        found = [Fix((), plan)] if plan.fits else runtime_fixes(arch, adapted, None, limit=1)
        for fix in found:
            overrides = (f"model.lora.rank={rank}", *fix.overrides)
            checked = verify(overrides) if verify else fix.plan
            if checked is not None and checked.fits:
                return [Fix(overrides, checked, LORA_NOTE)]
    return []
