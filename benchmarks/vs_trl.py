"""Benchmark 1: exgrpo vs TRL's GRPOTrainer at equal settings (not a test).

    python benchmarks/vs_trl.py [--quick] [--runs N] [--steps N] [--models tiny smollm2-135m]

Both sides train the same model on the same task for the same number of steps with the same
questions per step, K, max new tokens, lr and AdamW settings: `exgrpo train replay.ratio=0`
(on-policy Dr.GRPO) in the main .venv, and TRL's GRPOTrainer (benchmarks/trl_worker.py) in
.venv-bench, which holds the same torch and transformers (`make bench-venv`). The runs alternate
(TRL, exgrpo, TRL, exgrpo, ...). A step's wall time covers generation, reward, forward/backward
and the optimizer step on both sides; the first `--warmup` steps of each run are dropped.
Reported per side: rollouts/s and generated tokens/s (median over the measured steps, with the
min..max), peak RSS of the trainer process and of its process tree (the reward workers). The
ratio pairs step i of run j of one side with step i of run j of the other.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    BENCH_PY,
    Stat,
    exgrpo_train,
    last_json_line,
    log_stderr,
    model_overrides,
    python_of,
    ratio_stat,
    run_measured,
    smollm2_available,
    table,
    thread_env,
)

# per model: Hydra overrides both sides share. smollm2-135m is ~170x the tiny model's size, so its
# step is cut to a size a 2-core CPU finishes in seconds, not minutes.
WORKLOADS = {
    "tiny": ["algo.questions_per_step=16", "rollout.n=8", "model.max_response_tokens=48"],
    "smollm2-135m": ["algo.questions_per_step=2", "rollout.n=4", "model.max_response_tokens=32"],
}


def run_exgrpo(overrides: list[str], steps: int, out: Path, threads: int) -> dict:
    rows, proc = exgrpo_train(["replay.ratio=0", f"trainer.steps={steps}", *overrides], out, threads)
    return {
        "step_s": [r["timing/step"] for r in rows],
        "response_length": [r["rollout/response_length"] for r in rows],
        "rollouts": [r["rollout/responses"] for r in rows],
        "peak_rss_mb": proc.peak_rss_mb,
        "tree_peak_rss_mb": proc.tree_peak_rss_mb,
        "wall_s": proc.wall_s,
    }


def run_trl(overrides: list[str], steps: int, threads: int) -> dict:
    py = python_of(BENCH_PY)
    proc = run_measured(
        [
            py,
            str(Path(__file__).with_name("trl_worker.py")),
            "--steps",
            str(steps),
            "--",
            f"trainer.threads={threads}",
            *overrides,
        ],
        env=thread_env(threads),
    )
    r = last_json_line(proc.stdout)
    n = len(r["step_s"])
    return {
        "step_s": r["step_s"],
        "response_length": r["response_length"][:n],
        "rollouts": [r["rollouts_per_step"]] * n,
        "peak_rss_mb": proc.peak_rss_mb,
        "tree_peak_rss_mb": proc.tree_peak_rss_mb,
        "wall_s": proc.wall_s,
    }


def per_step(run: dict, warmup: int) -> tuple[list[float], list[float]]:
    """(rollouts/s, generated tokens/s) of each measured step."""
    rs, ts = [], []
    for s, n, length in list(zip(run["step_s"], run["rollouts"], run["response_length"]))[warmup:]:
        rs.append(n / s)
        ts.append(n * length / s)
    return rs, ts


def compare(
    model: str, runs: int, steps: int, warmup: int, threads: int, log: Callable[[str], None] = print
) -> dict[str, Any]:
    overrides = model_overrides(model) + WORKLOADS[model]
    sides: dict[str, list[dict]] = {"trl": [], "exgrpo": []}
    with tempfile.TemporaryDirectory(prefix="exgrpo-bench-") as tmp:
        for i in range(runs):
            sides["trl"].append(run_trl(overrides, steps, threads))
            sides["exgrpo"].append(run_exgrpo(overrides, steps, Path(tmp) / f"{model}-{i}", threads))
            log(
                f"  {model} run {i + 1}/{runs}: TRL {_mean(sides['trl'][-1]['step_s'][warmup:]):.2f} s/step, "
                f"exgrpo {_mean(sides['exgrpo'][-1]['step_s'][warmup:]):.2f} s/step"
            )
    out: dict = {
        "model": model,
        "overrides": overrides,
        "runs": runs,
        "steps": steps,
        "warmup": warmup,
        "threads": threads,
    }
    paired = {"rollouts_per_s": ([], []), "tokens_per_s": ([], [])}
    for name, rs in sides.items():
        roll, tok = [], []
        for r in rs:
            a, b = per_step(r, warmup)
            roll += a
            tok += b
        out[name] = {
            "rollouts_per_s": Stat(roll).as_json(),
            "tokens_per_s": Stat(tok).as_json(),
            "peak_rss_mb": Stat([r["peak_rss_mb"] for r in rs]).as_json(),
            "tree_peak_rss_mb": Stat([r["tree_peak_rss_mb"] for r in rs]).as_json(),
            "step_s": Stat([s for r in rs for s in r["step_s"][warmup:]]).as_json(),
            "raw": rs,
        }
        k = 0 if name == "exgrpo" else 1
        paired["rollouts_per_s"][k].extend(roll)
        paired["tokens_per_s"][k].extend(tok)
    out["speedup_rollouts"] = ratio_stat(*paired["rollouts_per_s"]).as_json()
    out["speedup_tokens"] = ratio_stat(*paired["tokens_per_s"]).as_json()
    out["memory_ratio"] = ratio_stat(
        [r["peak_rss_mb"] for r in sides["exgrpo"]], [r["peak_rss_mb"] for r in sides["trl"]]
    ).as_json()
    return out


def _mean(v: list[float]) -> float:
    return sum(v) / max(len(v), 1)


def render(results: list[dict]) -> str:
    rows = []
    for r in results:
        if "skipped" in r:
            rows.append([r["model"], "skipped: " + r["skipped"], "", "", "", "", ""])
            continue
        for side in ("trl", "exgrpo"):
            s = r[side]
            rows.append(
                [
                    r["model"],
                    "TRL GRPOTrainer" if side == "trl" else "exgrpo (ratio=0)",
                    Stat(s["rollouts_per_s"]["values"]).fmt(".3g"),
                    Stat(s["tokens_per_s"]["values"]).fmt(".4g"),
                    f"{s['peak_rss_mb']['median']:.0f} / {s['tree_peak_rss_mb']['median']:.0f}",
                    "",
                    "",
                ]
            )
        rows[-1][5] = Stat(r["speedup_rollouts"]["values"]).fmt(".2f") + "x"
        rows[-1][6] = f"{r['memory_ratio']['median']:.2f}x"
    return table(
        [
            "model",
            "trainer",
            "rollouts/s",
            "gen tokens/s",
            "peak RSS MB (proc / tree)",
            "exgrpo/TRL rollouts/s",
            "exgrpo/TRL RSS",
        ],
        rows,
    )


def run(
    quick: bool,
    runs: int | None = None,
    steps: int | None = None,
    models: list[str] | None = None,
    threads: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    if python_of(BENCH_PY) is None:
        return {"skipped": "no .venv-bench with TRL: run `make bench-venv` first", "results": []}
    models = models or (["tiny"] if quick else ["tiny", "smollm2-135m"])
    results = []
    for model in models:
        if model == "smollm2-135m" and not smollm2_available():
            results.append({"model": model, "skipped": "no conf/model/smollm2-135m.yaml preset yet"})
            continue
        small = model != "tiny"
        r = runs or (1 if quick else 2)
        s = steps or (3 if small else 4 if quick else 8)
        try:
            results.append(compare(model, r, s, warmup=1, threads=threads, log=log))
        except RuntimeError as err:  # one model's failure must not lose the other's figures
            results.append(
                {
                    "model": model,
                    "skipped": f"failed: {str(err).splitlines()[0][:300]}",
                    "detail": str(err)[-3000:],
                }
            )
    return {"results": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--runs", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--models", nargs="*")
    p.add_argument("--threads", type=int, default=0, help="torch threads of both sides (0: all cores)")
    a = p.parse_args()
    res = run(a.quick, a.runs, a.steps, a.models, a.threads, log=log_stderr)
    if res.get("skipped"):
        print(res["skipped"], file=sys.stderr)
    else:
        print(render(res["results"]), file=sys.stderr)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
