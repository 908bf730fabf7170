"""Benchmark 2: the cost of ExGRPO's replay over on-policy GRPO, per step (not a test).

    python benchmarks/overhead.py [--quick] [--runs N] [--steps N]

`exgrpo train replay.ratio=0.5` against `replay.ratio=0`, both with `replay.start_threshold=0`
(replay from step 2) and the same questions per step, so the update sees the same number of rows;
runs alternate. Steps before `--warmup` are dropped, so every measured ratio-0.5 step is a mixed
step (the buffer holds enough questions from step 2 or 3 on). Reported: time per step of each
side, the ratio, and where the replay side's extra time goes, from its `timing/` metrics: `select`
(question and trajectory selection) of which `select_scoring` (the entropy forward over the
selected questions' stored experiences), and `buffer` (observe, retire, re-admit).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Stat, exgrpo_train, log_stderr, ratio_stat, table  # noqa: E402

PARTS = ("select", "select_scoring", "buffer", "rollout", "reward", "update")


def run(quick: bool, runs: int | None = None, steps: int | None = None, threads: int = 0,
        warmup: int = 2, log=log_stderr) -> dict:  # noqa: ANN001
    runs = runs or (1 if quick else 2)
    steps = steps or (5 if quick else 8)
    sides: dict[float, list[list[dict]]] = {0.0: [], 0.5: []}
    with tempfile.TemporaryDirectory(prefix="exgrpo-bench-") as tmp:
        for i in range(runs):
            for ratio in sides:
                rows, _ = exgrpo_train([f"replay.ratio={ratio}", "replay.start_threshold=0",
                                        f"trainer.steps={steps}"], Path(tmp) / f"r{ratio}-{i}", threads)
                sides[ratio].append(rows[warmup:])
            log(f"  overhead run {i + 1}/{runs}: ratio 0 {_med(sides[0.0][-1]):.2f} s/step, "
                f"ratio 0.5 {_med(sides[0.5][-1]):.2f} s/step")
    step = {r: [x["timing/step"] for rs in runs_ for x in rs] for r, runs_ in sides.items()}
    mixed = [x for rs in sides[0.5] for x in rs]
    parts = {p: Stat([x.get(f"timing/{p}", 0.0) for x in mixed]).as_json() for p in PARTS}
    return {"runs": runs, "steps": steps, "warmup": warmup, "threads": threads,
            "step_s": {str(r): Stat(v).as_json() for r, v in step.items()},
            "ratio": ratio_stat(step[0.5], step[0.0]).as_json(),
            "replay_parts_s": parts,
            "replayed_questions": Stat([x["replay/replayed_questions"] for x in mixed]).as_json(),
            "rows": Stat([x["rollout/rows"] for x in mixed]).as_json(),
            # what else differs at equal rows: a replayed question needs K-1 fresh samples, and
            # the policies (hence response lengths) drift apart
            "generated": {str(r): Stat([x["rollout/responses"] for rs in v for x in rs]).as_json()
                          for r, v in sides.items()},
            "response_length": {str(r): Stat([x["rollout/response_length"] for rs in v for x in rs]).as_json()
                                for r, v in sides.items()},
            "update_s": {str(r): Stat([x["timing/update"] for rs in v for x in rs]).as_json()
                         for r, v in sides.items()}}


def _med(rows: list[dict]) -> float:
    return Stat([r["timing/step"] for r in rows]).median


def render(res: dict) -> str:
    s0, s5 = Stat(res["step_s"]["0.0"]["values"]), Stat(res["step_s"]["0.5"]["values"])
    ratio = Stat(res["ratio"]["values"])
    parts = res["replay_parts_s"]
    share = {p: parts[p]["median"] / s5.median for p in ("select", "select_scoring", "buffer")}
    rows = [["s/step, replay.ratio=0", s0.fmt(".3g")], ["s/step, replay.ratio=0.5", s5.fmt(".3g")],
            ["ratio 0.5 / ratio 0 (paired steps)", ratio.fmt(".3f") + "x"],
            ["replayed questions per step", f"{res['replayed_questions']['median']:.0f} of 16"]]
    g, ln, up = res["generated"], res["response_length"], res["update_s"]
    both = lambda d, f: f"{d['0.0']['median']:{f}} / {d['0.5']['median']:{f}}"  # noqa: E731
    rows += [["rollouts generated per step (ratio 0 / 0.5)", both(g, ".0f")],
             ["mean response tokens (ratio 0 / 0.5)", both(ln, ".1f")],
             ["timing/update s (ratio 0 / 0.5)", both(up, ".3g")]]
    rows += [[f"timing/{p} (ratio 0.5)", f"{parts[p]['median'] * 1000:.1f} ms ({share[p]:.1%} of the step)"]
             for p in ("select", "select_scoring", "buffer")]
    return table(["ExGRPO overhead (tiny model, 16 questions x K=8)", "value"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--runs", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--threads", type=int, default=0, help="torch threads of both sides (0: all cores)")
    a = p.parse_args()
    res = run(a.quick, a.runs, a.steps, a.threads)
    print(render(res), file=sys.stderr)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
