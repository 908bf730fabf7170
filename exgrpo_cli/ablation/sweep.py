"""A sweep's plan: a preset's variants x seeds -> one `exgrpo train` job each, and its bookkeeping.

Place: `exgrpo ablate` (commands/ablate.py) reads `cfg.ablation`, calls `parse_variants` and
`plan_jobs`, runs each job's `train_argv` (or one `multirun_argv` per variant under a Hydra launcher
plugin), and marks each run dir with `ablate.json`. Layout of a sweep dir:

    <sweep>/sweep.json               the plan: variants (name, dir, overrides), seeds, baseline
    <sweep>/<variant>/seed<k>/       an ordinary `exgrpo train` run dir (metrics.jsonl, checkpoints/)
    <sweep>/<variant>/seed<k>/ablate.json      the marker: finished, wall time, overrides
    <sweep>/<variant>/seed<k>/ablate_train.log the run's console output

A job's overrides are merged key by key, later groups winning: the preset's `ablation.base`, then
the ablate command line's own overrides (so `trainer.steps=5` reaches every run), then the
variant's overrides (the point of the sweep), then `trainer.seed`.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo_cli.checkpoint.safe_read import MAX_JSON_BYTES, read_regular, special_entry
from exgrpo_cli.errors import UsageError

PLAN_FILE = "sweep.json"
MARKER = "ablate.json"
TRAIN_LOG = "ablate_train.log"


class SweepError(UsageError):
    """The sweep cannot be planned (exit code 2); the message names the key."""


@dataclass(frozen=True)
class Variant:
    name: str  # as written in the preset, e.g. "w/o-shaping"
    slug: str  # its folder name, e.g. "wo-shaping"
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Job:
    variant: Variant
    seed: int
    run_dir: Path
    overrides: tuple[str, ...]  # everything `exgrpo train` gets except hydra.run.dir

    @property
    def label(self) -> str:
        return f"{self.variant.name} seed {self.seed}"


def slugify(name: str) -> str:
    """A folder name for a variant: '/' dropped ("w/o" -> "wo"), other odd characters -> '-'."""
    s = re.sub(r"[^A-Za-z0-9._=+-]+", "-", name.replace("/", "")).strip("-.")
    return s or "variant"


def override_key(override: str) -> str:
    """The key an override sets: 'replay.ratio=0' -> 'replay.ratio', '+a.b=1' / '~a.b' -> 'a.b'."""
    return override.split("=", 1)[0].strip().lstrip("+~")


def _check_override(where: str, o: Any) -> str:
    if not isinstance(o, str) or not o.strip() or ("=" not in o and not o.startswith("~")):
        raise SweepError(f"{where}: each override is a string key=value (got {o!r})")
    return o.strip()


def parse_variants(raw: Mapping[str, Any]) -> list[Variant]:
    """Validate `ablation.variants` (name -> list of overrides, in the preset's order)."""
    if not raw:
        raise SweepError(
            "ablation.variants is empty: choose a sweep with ablation=<name>, or define "
            "variants in a preset (name: [key=value, ...])"
        )
    variants: list[Variant] = []
    slugs: dict[str, str] = {}
    for name, ov in raw.items():
        if ov is None:
            ov = []
        if isinstance(ov, str):
            ov = [ov]
        if not isinstance(ov, (list, tuple)):
            raise SweepError(
                f"ablation.variants.{name}: a list of overrides such as [replay.shaping=false] (got {ov!r})"
            )
        overrides = tuple(_check_override(f"ablation.variants.{name}", o) for o in ov)
        slug = slugify(str(name))
        if slug in slugs:
            raise SweepError(
                f"ablation.variants: {slugs[slug]!r} and {name!r} would share the folder {slug!r}"
            )
        slugs[slug] = name
        variants.append(Variant(str(name), slug, overrides))
    return variants


def merge_overrides(*groups: Iterable[str]) -> list[str]:
    """One override per key, the last one given winning (Hydra refuses some repeated keys)."""
    merged: dict[str, str] = {}
    for group in groups:
        for o in group:
            k = override_key(o)
            merged.pop(k, None)
            merged[k] = o
    return list(merged.values())


def passthrough(task_overrides: Iterable[str]) -> list[str]:
    """The ablate command line's overrides that the runs inherit: all but the ablation ones."""
    return [o for o in task_overrides if re.split(r"[./]", override_key(o))[0] != "ablation"]


def pick_baseline(names: list[str], requested: str) -> str:
    if not requested:
        return names[0]
    if requested not in names:
        raise SweepError(f"invalid ablation.baseline={requested!r}: allowed one of {', '.join(names)}")
    return requested


def plan_jobs(
    variants: list[Variant],
    seeds: list[int],
    sweep_dir: Path,
    base: Iterable[str],
    inherited: Iterable[str],
    name: str = "",
) -> list[Job]:
    """Variant-major order: every seed of the first variant, then the next variant.

    With a sweep `name`, each run is also named for W&B (group = the sweep, name = variant-seed),
    should the user turn W&B on; any explicit logger.wandb.* override wins.
    """
    base, inherited = list(base), list(inherited)
    for o in base:
        _check_override("ablation.base", o)
    jobs: list[Job] = []
    for v in variants:
        for s in seeds:
            wandb = [f"logger.wandb.group={name}", f"logger.wandb.name={v.slug}-seed{s}"] if name else []
            ov = merge_overrides(wandb, base, inherited, v.overrides, [f"trainer.seed={s}"])
            jobs.append(Job(v, s, sweep_dir / v.slug / f"seed{s}", tuple(ov)))
    return jobs


def hydra_value(path: Path) -> str:
    """A path as a Hydra override value: quoted when it holds characters the grammar reserves."""
    s = str(path)
    if re.fullmatch(r"[A-Za-z0-9_./\-+@%]+", s):
        return s
    if "'" in s:
        raise SweepError(f"a sweep dir may not contain a single quote: {s}")
    return f"'{s}'"


def train_argv(job: Job, python: str = sys.executable) -> list[str]:
    return [python, "-m", "exgrpo_cli", "train", *job.overrides, f"hydra.run.dir={hydra_value(job.run_dir)}"]


def multirun_argv(
    jobs: list[Job], launcher: str, launcher_overrides: Iterable[str], python: str = sys.executable
) -> list[str]:
    """One `exgrpo train -m` over the seeds of one variant, run by a Hydra launcher plugin.

    Each seed lands in the same `<sweep>/<variant>/seed<k>` dir as in the sequential mode, so
    markers, restarts and the summary work the same way.
    """
    first = jobs[0]
    shared = [o for o in first.overrides if override_key(o) != "trainer.seed"]
    seeds = ",".join(str(j.seed) for j in jobs)
    return [
        python,
        "-m",
        "exgrpo_cli",
        "train",
        "-m",
        f"hydra/launcher={launcher}",
        *launcher_overrides,
        *shared,
        f"trainer.seed={seeds}",
        f"hydra.sweep.dir={hydra_value(first.run_dir.parent)}",
        "hydra.sweep.subdir=seed${trainer.seed}",
    ]


def shell_command(argv: list[str]) -> str:
    """The argv as a user would type it (`exgrpo ...` rather than `python -m exgrpo_cli ...`)."""
    if argv[1:3] == ["-m", "exgrpo_cli"]:
        argv = ["exgrpo", *argv[3:]]
    return shlex.join(argv)


# ----------------------------------------------------------------------------- run bookkeeping


def read_json(path: Path) -> dict[str, Any] | None:
    """A bookkeeping file of the sweep (a run's marker, the plan), None when absent or unreadable
    as JSON; a path that is not a regular file (a FIFO blocked the sweep for ever) is refused."""
    special = special_entry(path)
    if special:
        raise UsageError(special)
    try:
        value = json.loads(read_regular(path, MAX_JSON_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def configured_steps(run_dir: Path) -> int | None:
    """trainer.steps of the run, from the config Hydra saved in the run dir."""
    saved = run_dir / ".hydra" / "config.yaml"
    if not saved.is_file():
        return None
    from omegaconf import OmegaConf

    try:
        return int(OmegaConf.load(saved).trainer.steps)
    except Exception:  # an unreadable config: treat the run as unfinished
        return None


def completed_step(run_dir: Path) -> int | None:
    """The step of the run's latest complete checkpoint."""
    from exgrpo_cli.checkpoint.store import latest_checkpoint

    ck = latest_checkpoint(run_dir / "checkpoints")
    return None if ck is None else int(ck.name.split("_")[1])


def training_finished(run_dir: Path) -> bool:
    """A run finished when its latest complete checkpoint is at its configured last step.

    (A run stopped by SIGINT exits 0 with an earlier checkpoint: the exit code is not enough.)
    """
    steps, done = configured_steps(run_dir), completed_step(run_dir)
    return steps is not None and done is not None and done >= steps


def is_finished(run_dir: Path) -> bool:
    marker = read_json(run_dir / MARKER)
    return bool(marker and marker.get("finished")) or training_finished(run_dir)


def wall_from_files(run_dir: Path) -> float | None:
    """Estimated wall time of a run launched by a plugin: Hydra's job start to the final checkpoint."""
    from exgrpo_cli.checkpoint.store import latest_checkpoint

    start, ck = run_dir / ".hydra" / "overrides.yaml", latest_checkpoint(run_dir / "checkpoints")
    if not start.is_file() or ck is None:
        return None
    return max(0.0, (ck / "COMPLETE").stat().st_mtime - start.stat().st_mtime)


def write_marker(job: Job, finished: bool, wall_s: float | None, returncode: int | None) -> dict[str, Any]:
    """Record one attempt; wall time adds up over the attempts of a resumed run."""
    path = job.run_dir / MARKER
    prev = read_json(path) or {}
    total = None if wall_s is None else float(prev.get("wall_s") or 0.0) + wall_s
    marker = {
        "variant": job.variant.name,
        "seed": job.seed,
        "finished": finished,
        "wall_s": total,
        "attempts": int(prev.get("attempts", 0)) + 1,
        "returncode": returncode,
        "overrides": list(job.overrides),
    }
    job.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.unlink(missing_ok=True)  # ours: whatever is there (a planted FIFO blocked the write) goes
    tmp.write_text(json.dumps(marker, indent=1))
    tmp.replace(path)
    return marker


def write_plan(
    sweep_dir: Path,
    name: str,
    variants: list[Variant],
    seeds: list[int],
    baseline: str,
    base: list[str],
    inherited: list[str],
    compare_to: Mapping[str, str] | None = None,
) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    plan = {
        "name": name,
        "baseline": baseline,
        "compare_to": dict(compare_to or {}),
        "seeds": seeds,
        "base": base,
        "inherited": inherited,
        "variants": [{"name": v.name, "dir": v.slug, "overrides": list(v.overrides)} for v in variants],
    }
    special = special_entry(sweep_dir / PLAN_FILE)  # a FIFO there blocked the sweep in open()
    if special:
        raise UsageError(special)
    (sweep_dir / PLAN_FILE).write_text(json.dumps(plan, indent=1))


def read_plan(sweep_dir: Path) -> dict[str, Any]:
    """The plan of a sweep dir; without sweep.json, every `<dir>/seed*` folder with metrics counts."""
    plan = read_json(sweep_dir / PLAN_FILE)
    if plan:
        return plan
    found = sorted({p.parent.parent.name for p in sweep_dir.glob("*/seed*/metrics.jsonl")})
    if not found:
        raise SweepError(f"{sweep_dir} holds no sweep (no {PLAN_FILE}, no <variant>/seed<k>/metrics.jsonl)")
    return {
        "name": sweep_dir.name,
        "baseline": found[0],
        "seeds": None,
        "variants": [{"name": d, "dir": d, "overrides": []} for d in found],
    }
