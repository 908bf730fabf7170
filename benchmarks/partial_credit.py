"""A continuous reward on the embedded default: ExGRPO against on-policy Dr.GRPO, several seeds.

The reward is docs/examples/closeness.py (partial credit: how close the final number is to the
answer), through `reward=python`. Each run is a plain `exgrpo train` of the default (16 questions x
8 responses a step) for `--steps` steps; the curves of `reward/mean` (the fresh responses' mean
reward) and `reward/accuracy` (their share that is exact, reward >= reward.correct_at = 1) go to
curves.png, the start/end figures to summary.json and summary.md.

    python benchmarks/partial_credit.py --out benchmarks/results/<date>-partial-credit \\
        --runs /tmp/partial-credit-runs [--parallel 2]

`--summarize` redoes only the summary from the runs already in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FUNCTION = "docs/examples/closeness.py:closeness"
VARIANTS = {
    "on-policy": ["replay.ratio=0"],
    "exgrpo": [],  # the default: replay.ratio=0.5, buckets by correct count
    "exgrpo-reward-std": ["replay.bucket_by=reward_std"],
}
WINDOW = 10  # steps averaged for the start and end figures (one step's mean is noisy)


def run_one(runs: Path, variant: str, seed: int, steps: int) -> dict:
    run_dir = runs / f"{variant}-seed{seed}"
    if (run_dir / "metrics.jsonl").is_file() and _steps_done(run_dir) >= steps:
        return {"variant": variant, "seed": seed, "wall_s": None, "rc": 0}
    cmd = [
        sys.executable, "-m", "exgrpo_cli", "train", "reward=python", f"reward.function={FUNCTION}",
        f"trainer.steps={steps}", f"trainer.seed={seed}", "trainer.threads=1", "trainer.val_questions=64",
        "trainer.val_samples=1", "logger.wandb.mode=disabled", "logger.console=false",
        "trainer.resume=never", "trainer.overwrite=true", f"hydra.run.dir={run_dir}", *VARIANTS[variant],
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode:
        print(f"{variant} seed {seed}: exit {res.returncode}\n{res.stderr[-2000:]}", file=sys.stderr)
    return {"variant": variant, "seed": seed, "wall_s": wall, "rc": res.returncode}


def _steps_done(run_dir: Path) -> int:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return max((r["step"] for r in rows if "reward/mean" in r), default=0)


def curves(run_dir: Path) -> dict[str, list[float]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = sorted((r for r in rows if "reward/mean" in r), key=lambda r: r["step"])
    keys = ("reward/mean", "reward/accuracy", "replay/active", "timing/step")
    return {"step": [r["step"] for r in rows], **{k: [float(r.get(k, 0.0)) for r in rows] for k in keys}}


def summarize(out: Path, runs_root: Path, walls: dict[tuple[str, int], float | None]) -> dict:
    runs = []
    for run_dir in sorted(p for p in runs_root.iterdir() if (p / "metrics.jsonl").is_file()):
        variant, seed = run_dir.name.rsplit("-seed", 1)
        c = curves(run_dir)
        mean, acc = c["reward/mean"], c["reward/accuracy"]
        started = next((s for s, a in zip(c["step"], c["replay/active"]) if a), None)
        runs.append(
            {
                "variant": variant,
                "seed": int(seed),
                "steps": len(mean),
                "mean_start": float(np.mean(mean[:WINDOW])),
                "mean_end": float(np.mean(mean[-WINDOW:])),
                "accuracy_start": float(np.mean(acc[:WINDOW])),
                "accuracy_end": float(np.mean(acc[-WINDOW:])),
                "distinct_rewards": len({round(x, 6) for x in mean}),
                "replay_started_at": started,
                "wall_s": walls.get((variant, int(seed))),  # the whole command (None: not recorded)
                "train_s": float(sum(c["timing/step"])),  # the steps' own time, validation left out
                "curve_mean": mean,
            }
        )
    summary = {
        "reward": FUNCTION,
        "window": WINDOW,
        "runs": runs,
        "note": "mean_start / mean_end: reward/mean averaged over the first / last `window` steps",
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        f"# Partial-credit reward ({FUNCTION}) on the embedded default",
        "",
        f"reward/mean (fresh responses' mean reward) and reward/accuracy (share exact), each the mean of the first / last {WINDOW} steps.",  # noqa: E501
        "",
        "| variant | seed | steps | reward/mean start -> end | reward/accuracy start -> end "
        "| replay from step | steps' time s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        wall = f"{r['train_s']:.0f}"
        lines.append(
            f"| {r['variant']} | {r['seed']} | {r['steps']} | {r['mean_start']:.3f} -> {r['mean_end']:.3f} | "
            f"{r['accuracy_start']:.3f} -> {r['accuracy_end']:.3f} | {r['replay_started_at'] or '-'} "
            f"| {wall} |"
        )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    plot(out, runs)
    return summary


def plot(out: Path, runs: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colours = dict(zip(VARIANTS, ("tab:blue", "tab:orange", "tab:green")))
    for variant in VARIANTS:
        mine = [r["curve_mean"] for r in runs if r["variant"] == variant]
        if not mine:
            continue
        n = min(map(len, mine))
        for c in mine:
            ax.plot(range(1, n + 1), c[:n], color=colours[variant], alpha=0.25, linewidth=0.8)
        ax.plot(range(1, n + 1), np.mean([c[:n] for c in mine], axis=0), color=colours[variant], linewidth=2,
                label=f"{variant} (mean of {len(mine)} seeds)")  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("reward/mean (partial credit)")
    ax.set_title("Partial-credit reward on the embedded default")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--runs", type=Path, required=True, help="where the runs go (checkpoints: not the results)"
    )
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--summarize", action="store_true")
    ap.add_argument("--jobs", nargs="*", default=None, help="variant:seed pairs to run (default: all)")
    args = ap.parse_args()
    walls_file = args.out / "walls.json"
    walls = (
        {tuple(k.split("|")): v for k, v in json.loads(walls_file.read_text()).items()}
        if walls_file.is_file()
        else {}
    )
    walls = {(v, int(s)): w for (v, s), w in walls.items()}
    if not args.summarize:
        args.out.mkdir(parents=True, exist_ok=True)
        jobs = [(v, s) for s in range(args.seeds) for v in args.variants]
        if args.jobs is not None:
            jobs = [(j.rsplit(":", 1)[0], int(j.rsplit(":", 1)[1])) for j in args.jobs]
        with ThreadPoolExecutor(args.parallel) as pool:
            for r in pool.map(lambda job: run_one(args.runs, job[0], job[1], args.steps), jobs):
                print(json.dumps(r), flush=True)
                if r["wall_s"] is not None:
                    walls[(r["variant"], r["seed"])] = r["wall_s"]
                    walls_file.write_text(json.dumps({f"{v}|{s}": w for (v, s), w in walls.items()}))
    summarize(args.out, args.runs, walls)


if __name__ == "__main__":
    main()
