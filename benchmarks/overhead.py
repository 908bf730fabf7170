"""Benchmark 2: the cost of ExGRPO's replay over on-policy GRPO, per step (not a test).

    python benchmarks/overhead.py [--quick] [--steps N] [--threads N]

Two trainers in one process, built like `exgrpo train` builds them: `replay.ratio=0.5` and
`replay.ratio=0`, both with `replay.start_threshold=0` (replay from step 2) and the same questions
per step, so the update sees the same number of rows. Their steps alternate (A B, B A, A B, ...):
a shared machine's load, which swung separate runs by 2x, falls on both alike. Steps before
`--warmup` are dropped, so every measured ratio-0.5 step is a mixed step (the buffer holds enough
questions from step 2 or 3 on). Reported: time per step of each side, the paired ratio, and where
the replay side's extra time goes, from its `timing/` metrics: `select` (question and trajectory
selection) of which `select_scoring` (the entropy forward over the selected questions' stored
experiences), and `buffer` (observe, retire, re-admit).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exgrpo_cli.step.loop import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Stat, compose_config, log_stderr, ratio_stat, table  # noqa: E402

PARTS = ("select", "select_scoring", "buffer", "rollout", "reward", "update")
RATIOS = (0.0, 0.5)


def build_trainer(ratio: float) -> Trainer:
    """The trainer `exgrpo train` builds (run/setup.py), without its run directory and logging."""
    import torch

    from exgrpo_cli.run.setup import build_trainer as build

    cfg = compose_config(
        [f"replay.ratio={ratio}", "replay.start_threshold=0", "trainer.output_dir=/tmp/exgrpo-bench-overhead"]
    )
    trainer, _, _ = build(cfg, torch.device("cpu"))
    return trainer


def run(
    quick: bool,
    steps: int | None = None,
    threads: int = 0,
    warmup: int = 2,
    log: Callable[[str], None] = log_stderr,
) -> dict[str, Any]:
    import torch

    if threads:
        torch.set_num_threads(threads)
    steps = steps or (6 if quick else 14)
    trainers = {r: build_trainer(r) for r in RATIOS}
    rows: dict[float, list[dict]] = {r: [] for r in RATIOS}
    try:
        for step in range(1, steps + 1):
            for r in RATIOS if step % 2 else RATIOS[::-1]:
                m = trainers[r].train_step(step)
                if step > warmup:
                    rows[r].append(m)
            if step > warmup:
                log(
                    f"  overhead step {step}/{steps}: ratio 0 {rows[0.0][-1]['timing/step']:.2f} s, "
                    f"ratio 0.5 {rows[0.5][-1]['timing/step']:.2f} s"
                )
    finally:
        for t in trainers.values():
            t.scorer.close()
    step_s = {r: [x["timing/step"] for x in v] for r, v in rows.items()}
    mixed = rows[0.5]
    per_side = lambda key: {str(r): Stat([x[key] for x in v]).as_json() for r, v in rows.items()}  # noqa: E731
    return {
        "steps": steps,
        "warmup": warmup,
        "threads": torch.get_num_threads(),
        "step_s": {str(r): Stat(v).as_json() for r, v in step_s.items()},
        "ratio": ratio_stat(step_s[0.5], step_s[0.0]).as_json(),
        "replay_parts_s": {p: Stat([x.get(f"timing/{p}", 0.0) for x in mixed]).as_json() for p in PARTS},
        "replayed_questions": Stat([x["replay/replayed_questions"] for x in mixed]).as_json(),
        "rows": Stat([x["rollout/rows"] for x in mixed]).as_json(),
        # what else differs at equal rows: a replayed question needs K-1 fresh samples, and
        # the policies (hence response lengths) drift apart
        "generated": per_side("rollout/responses"),
        "update_s": per_side("timing/update"),
        "response_length": per_side("rollout/response_length"),
    }


def render(res: dict) -> str:
    s0, s5 = Stat(res["step_s"]["0.0"]["values"]), Stat(res["step_s"]["0.5"]["values"])
    ratio = Stat(res["ratio"]["values"])
    parts = res["replay_parts_s"]
    share = {p: parts[p]["median"] / s5.median for p in ("select", "select_scoring", "buffer")}
    rows = [
        ["s/step, replay.ratio=0", s0.fmt(".3g")],
        ["s/step, replay.ratio=0.5", s5.fmt(".3g")],
        ["ratio 0.5 / ratio 0 (paired steps)", ratio.fmt(".3f") + "x"],
        ["replayed questions per step", f"{res['replayed_questions']['median']:.0f} of 16"],
    ]
    g, ln, up = res["generated"], res["response_length"], res["update_s"]
    both = lambda d, f: f"{d['0.0']['median']:{f}} / {d['0.5']['median']:{f}}"  # noqa: E731
    rows += [
        ["rollouts generated per step (ratio 0 / 0.5)", both(g, ".0f")],
        ["mean response tokens (ratio 0 / 0.5)", both(ln, ".1f")],
        ["timing/update s (ratio 0 / 0.5)", both(up, ".3g")],
    ]
    rows += [
        [f"timing/{p} (ratio 0.5)", f"{parts[p]['median'] * 1000:.1f} ms ({share[p]:.1%} of the step)"]
        for p in ("select", "select_scoring", "buffer")
    ]
    return table(["ExGRPO overhead (tiny model, 16 questions x K=8)", "value"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--steps", type=int)
    p.add_argument("--threads", type=int, default=0, help="torch threads of both sides (0: all cores)")
    a = p.parse_args()
    res = run(a.quick, a.steps, a.threads)
    print(render(res), file=sys.stderr)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
