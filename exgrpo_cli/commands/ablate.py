"""`exgrpo ablate ablation=<sweep>`: run a sweep of `exgrpo train` runs, then summarise it.

How the runs are launched:
- by default one after another, each as its own `python -m exgrpo_cli train <overrides>
  hydra.run.dir=<sweep>/<variant>/seed<k>` subprocess: a crash, an out-of-memory kill or a leaked
  thread in one run cannot affect the next, and each run dir is an ordinary train run dir (its
  .hydra/ config, log, metrics.jsonl, checkpoints) that `exgrpo train` itself can resume;
- with a Hydra launcher plugin chosen on the ablate command line (`hydra/launcher=joblib`, plus
  any `hydra.launcher.*` settings), each variant becomes one `exgrpo train -m` multirun over its
  seeds, launched by that plugin into the same dirs (wall times are then estimated from file times);
  for `hydra/launcher=submitit_slurm` (each run a SLURM job) every variant is submitted at once;
- `ablation.dry_run=true` prints the commands instead, to run elsewhere.

Restarts: runs whose training finished (final checkpoint at the configured last step, recorded in
`ablate.json`) are skipped when the same sweep dir is given again (`ablation.sweep_dir=<dir>`, or
`hydra.run.dir=<dir>`, which is the default sweep dir); an interrupted run resumes from its last
checkpoint. `ablation.summarize=<dir>` only redoes summary.md, summary.csv and curves.png.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from exgrpo_cli.ablation import runs
from exgrpo_cli.ablation import sweep as sw
from exgrpo_cli.ablation.compare import check_compare_to
from exgrpo_cli.ablation.report import summarize_dir
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.errors import ExgrpoError, UsageError

if TYPE_CHECKING:  # rich is imported when a command runs
    from rich.console import Console


class SweepInterrupted(ExgrpoError):
    exit_code = 130  # as a shell reports a Ctrl-C


def _presets() -> str:
    from exgrpo_cli.config.paths import config_dir

    names = sorted(p.stem for p in (Path(config_dir()) / "ablation").glob("*.yaml") if p.stem != "none")
    return ", ".join(names)


def _check_variants(jobs: list[sw.Job]) -> None:
    """Compose and check each variant's config as `exgrpo train` would, now, not an hour into the sweep."""
    from hydra import compose

    from exgrpo_cli.commands.compose import to_typed
    from exgrpo_cli.commands.variants import check_variants
    from exgrpo_cli.config.checks import validate
    from exgrpo_cli.config.schema import ConfigError

    for job in {j.variant.name: j for j in jobs}.values():
        try:
            composed = compose(config_name="config", overrides=list(job.overrides))
            typed = to_typed(composed)
            validate(typed, "train")
            check_variants(typed, "train")  # the names (selection rules, losses...), as `exgrpo train`
        except ConfigError as err:
            raise UsageError(f"variant {job.variant.name!r}: {err}") from None
        except Exception as err:  # Hydra's own errors: unknown key, bad override syntax
            raise UsageError(f"variant {job.variant.name!r}: {type(err).__name__}: {err}") from None


def recipe_choice(overrides: list[str]) -> str | None:
    """The override of the ablate command line that brings a paper recipe: `experiment=<name>`, or
    `model=<preset>` whose preset pulls in conf/recipe/ (the GPU backbones); None otherwise."""
    from exgrpo_cli.config.paths import config_dir

    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key == "experiment" and value not in ("", "null"):
            return o
        preset = Path(config_dir()) / "model" / f"{value}.yaml"
        if key == "model" and preset.is_file() and "/recipe/" in preset.read_text():
            return o
    return None


def _base_at_the_chosen_scale(base: list[str], inherited: list[str]) -> list[str]:
    """An ablation preset's `base` sizes its runs for the built-in tiny model on a CPU (50 steps, 8
    questions, one thread, W&B off). When the command line chooses a paper recipe, the recipe is the
    scale the user asked for: the base is not applied, and one line on stderr says what was left out.
    Explicit overrides on the command line win over the base in any case (sweep.plan_jobs)."""
    chosen = recipe_choice(inherited)
    if chosen is None or not base:
        return base
    explicit = {sw.override_key(o) for o in inherited}
    dropped = [o for o in base if sw.override_key(o) not in explicit]
    print(
        f"exgrpo ablate: {chosen} sets the runs' scale: the ablation's base "
        f"({' '.join(dropped)}) is not applied",
        file=sys.stderr,
    )
    return []


def run(cfg: ExgrpoConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from rich.console import Console

    a, console = cfg.ablation, Console()
    if a.summarize:
        summarize_dir(Path(a.summarize).expanduser(), a.baseline, console, dict(a.compare_to))
        return
    hc = HydraConfig.get()
    try:
        variants = sw.parse_variants(a.variants)
        baseline = sw.pick_baseline([v.name for v in variants], a.baseline)
        sweep = Path(a.sweep_dir).expanduser().resolve() if a.sweep_dir else Path(hc.runtime.output_dir)
        seeds = [cfg.trainer.seed + i for i in range(a.seeds)]
        inherited = sw.passthrough(hc.overrides.task)
        group = sw.slugify(a.name) if a.name else ""
        base = _base_at_the_chosen_scale(list(a.base), inherited)
        jobs = sw.plan_jobs(variants, seeds, sweep, base, inherited, group)
        check_compare_to(dict(a.compare_to), [v.name for v in variants])
    except (sw.SweepError, ValueError) as err:
        hint = f" (presets: {_presets()})" if not a.variants else ""
        raise UsageError(f"{err}{hint}") from None
    launcher = hc.runtime.choices.get("hydra/launcher") or "basic"
    launcher_overrides = [o for o in hc.overrides.hydra if sw.override_key(o).startswith("hydra.launcher.")]
    if a.dry_run:
        _print_commands(jobs, variants, launcher, launcher_overrides)
        return
    _check_variants(jobs)
    sw.write_plan(
        sweep, a.name or sweep.name, variants, seeds, baseline, list(a.base), inherited, dict(a.compare_to)
    )
    done = [j for j in jobs if sw.is_finished(j.run_dir)]
    _warn_changed(done, console)
    todo = [j for j in jobs if j not in done]
    partial = sum(sw.completed_step(j.run_dir) is not None for j in todo)
    console.print(
        f"[bold]exgrpo ablate {a.name}[/]: {len(variants)} variants x {len(seeds)} seeds = "
        f"{len(jobs)} runs ({len(done)} finished already"
        + (f", {partial} to resume" if partial else "")
        + f"); sweep dir {sweep}\n"
        f"restart with ablation.sweep_dir={sweep} to keep finished runs",
        highlight=False,
        soft_wrap=True,
    )
    try:
        if launcher == "basic":
            failed = runs.run_sequential(todo, console)
        else:
            failed = runs.run_with_launcher(todo, variants, launcher, launcher_overrides, console)
    except KeyboardInterrupt:
        raise SweepInterrupted(
            f"interrupted; to continue, rerun the same command with ablation.sweep_dir={sweep}"
        ) from None
    summarize_dir(sweep, a.baseline, console, dict(a.compare_to))
    if failed:
        raise ExgrpoError(
            f"{len(failed)} run(s) failed: "
            + ", ".join(j.label for j in failed)
            + f"; rerun with ablation.sweep_dir={sweep} to retry only those"
        )


def _print_commands(
    jobs: list[sw.Job], variants: list[sw.Variant], launcher: str, launcher_overrides: list[str]
) -> None:
    if launcher == "basic":
        for j in jobs:
            print(sw.shell_command(sw.train_argv(j)))
        return
    for v in variants:
        print(
            sw.shell_command(
                sw.multirun_argv([j for j in jobs if j.variant == v], launcher, launcher_overrides)
            )
        )


def _warn_changed(done: list[sw.Job], console: Console) -> None:
    for j in done:
        marker = sw.read_json(j.run_dir / sw.MARKER) or {}
        if marker.get("overrides") is not None and marker["overrides"] != list(j.overrides):
            console.print(
                f"[yellow]warning[/]: {j.label} finished with other overrides "
                f"({' '.join(marker['overrides'])}); kept (delete {j.run_dir} to rerun it)",
                highlight=False,
            )
