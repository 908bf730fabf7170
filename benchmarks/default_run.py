"""Benchmark of the embedded default run: wall time and held-out accuracy gain (not a test).

    python benchmarks/default_run.py                      # `exgrpo train` as is, seed 0
    python benchmarks/default_run.py --seeds 0 1 2 --ratios 0 0.5   # GRPO vs ExGRPO, 3 seeds

Each run is the real CLI in a subprocess with its own output dir; the script reads
`val/accuracy` at step 0 and at the last step from metrics.jsonl, sums the fresh rollouts, and
prints a table (median and spread over seeds). Results go to benchmarks/results/<date>-default.json,
with the date, the load, the commit and the torch/transformers versions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, provenance  # noqa: E402  (benchmarks/common.py: date, commit, versions)


def run_once(ratio: float | None, seed: int, extra: list[str], out: Path) -> dict:
    args = [sys.executable, "-m", "exgrpo_cli", "train", f"hydra.run.dir={out}", f"trainer.seed={seed}"]
    if ratio is not None:
        args.append(f"replay.ratio={ratio}")
    env = dict(os.environ, WANDB_MODE=os.environ.get("WANDB_MODE", "disabled"))
    t0 = time.perf_counter()
    res = subprocess.run(args + extra, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"run failed ({' '.join(args + extra)}):\n{res.stderr[-4000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    vals = [(r["step"], r["val/accuracy"]) for r in rows if r.get("val/accuracy") is not None]
    return {
        "ratio": ratio,
        "seed": seed,
        "wall_s": wall,
        "val_start": vals[0][1],
        "val_end": vals[-1][1],
        "gain": vals[-1][1] - vals[0][1],
        "steps": rows[-1]["step"],
        "fresh_rollouts": int(sum(r.get("rollout/responses", 0) for r in rows)),
        "replay_started_at": next((r["step"] for r in rows if r.get("replay/active") == 1.0), None),
    }


def summarise(runs: list[dict]) -> list[dict]:
    out = []
    for ratio in dict.fromkeys(r["ratio"] for r in runs):
        rs = [r for r in runs if r["ratio"] == ratio]

        def stat(key: str, rs: list[dict] = rs) -> tuple[float, float]:
            v = [r[key] for r in rs]
            return statistics.mean(v), (statistics.stdev(v) if len(v) > 1 else 0.0)

        out.append(
            {
                "ratio": ratio,
                "seeds": len(rs),
                "val_end": stat("val_end"),
                "gain": stat("gain"),
                "val_start": stat("val_start"),
                "wall_s": stat("wall_s"),
                "wall_s_median": statistics.median(r["wall_s"] for r in rs),
                "fresh_rollouts": stat("fresh_rollouts"),
            }
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument(
        "--ratios",
        type=float,
        nargs="*",
        default=None,
        help="replay.ratio values to compare (default: the config's own)",
    )
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--keep", type=Path, default=None, help="keep the run dirs here (default: a temp dir)")
    p.add_argument("extra", nargs="*", help="more Hydra overrides for every run")
    a = p.parse_args()
    ratios = a.ratios if a.ratios else [None]
    started = dt.datetime.now().isoformat(timespec="seconds")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        where = a.keep if a.keep is not None else Path(tmp)
        for ratio in ratios:
            for seed in a.seeds:
                r = run_once(ratio, seed, a.extra, where / f"r{ratio}_s{seed}")
                runs.append(r)
                print(
                    f"ratio={ratio} seed={seed}: {r['wall_s']:.0f}s  val {r['val_start']:.3f} -> "
                    f"{r['val_end']:.3f} ({r['gain']:+.3f})  fresh rollouts {r['fresh_rollouts']}  "
                    f"replay from step {r['replay_started_at']}",
                    flush=True,
                )
    summary = summarise(runs)
    print(
        "\n| replay.ratio | seeds | val start | val end (mean ± sd) | gain (mean ± sd) | wall s (median) "
        "| fresh rollouts |\n|---|---|---|---|---|---|---|"
    )
    for s in summary:
        name = s["ratio"] if s["ratio"] is not None else "default"
        print(
            f"| {name} | {s['seeds']} | {s['val_start'][0]:.3f} "
            f"| {s['val_end'][0]:.3f} ± {s['val_end'][1]:.3f} | {s['gain'][0]:+.3f} ± {s['gain'][1]:.3f} "
            f"| {s['wall_s_median']:.0f} | {s['fresh_rollouts'][0]:.0f} |"
        )
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"{dt.date.today().isoformat()}-default.json"
    record = {
        "date": started,
        "machine": {**machine_info(), "loadavg_end": os.getloadavg()[0]},
        "provenance": provenance(),
        "runs": runs,
        "summary": summary,
        "extra": a.extra,
    }
    path.write_text(json.dumps(record, indent=1))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
