"""`exgrpo inspect-buffer`: on a real checkpoint of a short ExGRPO run (the session's shared
replay_run, conftest.py) (text, JSON, show, plot), the
pure report maths, and the speed on a synthetic buffer of 100k experiences."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from exgrpo_cli.inspection import report as rp
from exgrpo_cli.replay.buffer import ExperienceBuffer

from conftest import SharedRun, run_cli
from shared_artefacts import private_copy


def _run_copy(replay_run: SharedRun, dest: Path) -> Path:
    """The shared replaying run (conftest.REPLAY_RUN: 3 steps, replay from step 1), copied: the plot
    below writes buffer.png into the run dir it inspects."""
    return private_copy(replay_run.dir, dest)


def _inspect(*args: str, cwd: Path) -> dict | str:
    res = run_cli(["inspect-buffer", *args, f"hydra.run.dir={cwd / 'hydra'}"], cwd=cwd)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads(res.stdout) if "--json" in args else res.stdout


@pytest.mark.slow
def test_inspect_a_real_run_as_json_and_text(replay_run: SharedRun, tmp_path: Path):
    run_dir = _run_copy(replay_run, tmp_path / "run")
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    buf = ExperienceBuffer.load(str(run_dir / "checkpoints/step_3/replay"))
    assert buf.num_questions > 0, "the tiny model solves some questions partly"
    rep = _inspect(str(run_dir), "--json", cwd=tmp_path)  # a run dir: its latest checkpoint
    assert rep["checkpoint"].endswith("checkpoints/step_3") and rep["step"] == 3
    assert rep["delayed_start"] == {"active": True, "started_at": 1, "threshold": 0.0}
    # the run's method, from its own .hydra/config.yaml (the default: no replay.method given)
    assert rep["replay_method"] == "exgrpo" and rep["replay_method_from"].endswith(".hydra/config.yaml")
    assert rep["stores"] == "responses with behaviour log-probs" and rep["without_behavior_logp"] == 0
    assert (rep["questions"], rep["experiences"], rep["retired"]) == (
        buf.num_questions,
        buf.num_experiences,
        len(buf.retired),
    )
    assert [b["questions"] for b in rep["buckets"]] == buf.bucket_sizes()
    assert sum(b["experiences"] for b in rep["buckets"]) == buf.num_experiences
    assert rep["response_length"]["count"] == buf.num_experiences
    assert sum(rep["response_length"]["histogram"]["counts"]) == buf.num_experiences
    top = rep["top_questions"][0]
    every = [u for b in range(buf.num_buckets) for u in buf.questions_in_bucket(b)]
    assert top["experiences"] == max(len(buf.experiences(u)) for u in every)

    text = _inspect(str(run_dir / "checkpoints/step_3"), cwd=tmp_path)  # a checkpoint dir
    for needle in (
        "delayed start",
        "replay method  exgrpo (from",
        "active since step 1",
        "buckets",
        f"{buf.num_experiences:,}",
        "stored response length",
        "behaviour log-prob",
        "questions with the most experiences",
    ):
        assert needle in text, needle

    uid = top["uid"]
    full = _inspect(
        str(run_dir), "--json", f"inspect.show={uid}", "inspect.score=true", "inspect.plot=true", cwd=tmp_path
    )
    shown = full["show"]
    assert shown["uid"] == uid and shown["question"] and len(shown["experiences"]) == top["experiences"]
    exps = buf.experiences(uid)
    assert [r["length"] for r in shown["experiences"]] == [e.response_ids.size for e in exps]
    assert all(r["text"] and r["entropy"] > 0 for r in shown["experiences"])
    assert "config.yaml" in shown["config"]  # question and template from the run's own config
    # nothing was written into the run it read: the plot went to the command's own run dir
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before
    assert Path(full["plot"]) == tmp_path / "hydra" / "buffer.png" and Path(full["plot"]).is_file()

    text = _inspect(str(run_dir), f"inspect.show={uid}", cwd=tmp_path)
    assert f"question {uid}" in text and "gold:" in text


def test_inspect_refuses_a_missing_target(tmp_path: Path):
    res = run_cli(["inspect-buffer", str(tmp_path / "nope"), f"hydra.run.dir={tmp_path / 'h'}"])
    assert res.returncode == 1 and "does not exist" in res.stderr


@pytest.mark.slow
def test_inspect_refuses_a_missing_question(replay_run: SharedRun, tmp_path: Path):
    res = run_cli(
        [
            "inspect-buffer",
            str(replay_run.dir),
            "inspect.show=no-such-question",
            "--json",
            f"hydra.run.dir={tmp_path / 'h'}",
        ]
    )
    assert res.returncode == 1 and "not in the buffer" in res.stderr and res.stdout == ""


def test_histogram_and_segment_means_exact():
    h = rp.histogram(np.array([3, 4, 4, 5, 9]), bins=10, integer=True)
    assert h == {"edges": [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], "counts": [1, 2, 1, 0, 0, 0, 1]}
    h = rp.histogram(np.arange(1, 41), bins=10, integer=True)  # wider ranges: whole-number widths
    assert h["edges"][:3] == [1.0, 5.0, 9.0] and h["counts"] == [4] * 10
    assert rp.histogram(np.array([-1.0, 0.0, 1.0]), bins=2)["counts"] == [1, 2]
    assert rp.segment_means(np.array([1.0, 3.0, 2.0, 2.0, 2.0, -6.0]), np.array([2, 3, 1])).tolist() == [
        2.0,
        2.0,
        -6.0,
    ]
    d = rp.distribution(np.array([1, 2, 3, 4]))
    assert (d["count"], d["mean"], d["min"], d["median"], d["max"]) == (4, 2.5, 1.0, 2.5, 4.0)
    assert rp.distribution(np.array([]))["count"] == 0


def test_report_of_a_small_buffer_exact():
    buf = ExperienceBuffer(4)
    ids = lambda n: np.arange(1, n + 1)  # noqa: E731
    buf.observe_group("a", 1, [(ids(2), np.array([-1.0, -3.0]))], step=1, collect=True)
    buf.observe_group(
        "b",
        3,
        [(ids(4), np.full(4, -0.5)), (ids(3), np.full(3, -0.25)), (ids(1), np.zeros(1))],
        step=2,
        collect=True,
    )
    buf.observe_group("c", 4, [], step=2, collect=True)
    buf.end_step()
    state = {"step": 2, "delayed_start": {"active": True, "started_at": 1, "threshold": 0}}
    rep = rp.buffer_report(buf, state)
    assert (rep["questions"], rep["experiences"], rep["retired"], rep["stored_tokens"]) == (2, 4, 1, 10)
    assert [(b["bucket"], b["questions"], b["experiences"]) for b in rep["buckets"]] == [
        (1, 1, 1),
        (2, 0, 0),
        (3, 1, 3),
    ]
    assert rep["behavior_logp_mean"]["min"] == -2.0 and rep["behavior_logp_mean"]["max"] == 0.0
    assert rep["top_questions"][0] == {
        "uid": "b",
        "bucket": 3,
        "accuracy": 0.75,
        "experiences": 3,
        "mean_length": 8 / 3,
    }
    assert rep["collected_at_step"]["histogram"]["counts"] == [1, 3]
    # ages at the checkpoint's step 2: a's experience is 1 step old, b's three were collected at it
    assert rep["age"]["histogram"]["counts"] == [3, 1] and rep["age"]["max"] == 1.0
    assert (rep["max_age"], rep["expired"]) == (0, 0)
    assert rp.buffer_report(buf, None)["age"]["count"] == 0  # no trainer_state.json: unknown


def test_the_age_view_names_the_limit_and_the_expired() -> None:
    from rich.console import Console

    from exgrpo_cli.inspection.render import render_report

    buf = ExperienceBuffer(4, max_age=2)
    for step in (1, 2, 3, 4):
        buf.observe_group(
            f"q{step}", 1, [(np.arange(1, 3) + step, np.full(2, -1.0))], step=step, collect=True
        )
    assert buf.expire(4) == 1
    rep = rp.buffer_report(buf, {"step": 4})
    assert rep["age"]["histogram"]["counts"] == [1, 1, 1] and (rep["max_age"], rep["expired"]) == (2, 1)
    console = Console(width=80, record=True)
    console.print(render_report(rep))
    assert "age, steps since collection at step 4 (replay.max_age=2, 1 expired)" in console.export_text()


def _synthetic_checkpoint(root: Path, n_experiences: int) -> Path:
    rng = np.random.default_rng(0)
    buf = ExperienceBuffer(8)
    n = q = 0
    while n < n_experiences:
        k = int(rng.integers(1, 8))
        m = min(k, n_experiences - n)
        lens = rng.integers(8, 49, size=m)
        correct = [(rng.integers(0, 512, size=L), -rng.random(L).astype(np.float32)) for L in lens]
        buf.observe_group(f"q{q}", k, correct, step=1 + q // 500, collect=True)
        n, q = n + m, q + 1
    assert buf.num_experiences == n_experiences
    ck = root / "checkpoints" / "step_40"
    buf.save(str(ck / "replay"))
    (ck / "trainer_state.json").write_text(
        json.dumps({"step": 40, "delayed_start": {"active": True, "started_at": 3, "threshold": 0.35}})
    )
    (ck / "COMPLETE").write_text(json.dumps({"step": 40}))
    (root / "checkpoints" / "latest").write_text("step_40")
    return root


def test_100k_experiences_in_a_few_seconds(tmp_path: Path):
    run = _synthetic_checkpoint(tmp_path / "run", 100_000)
    t0 = time.perf_counter()
    res = run_cli(["inspect-buffer", str(run), "--json", f"hydra.run.dir={tmp_path / 'h'}"])
    wall = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert rep["experiences"] == 100_000 and rep["step"] == 40
    # `seconds`: resolve + load + report inside the command, i.e. without interpreter/Hydra start-up
    assert rep["seconds"] < 15, rep["seconds"]
    assert wall < 60, wall  # the whole process, start-up included, on a busy 2-core CPU
    t0 = time.perf_counter()
    text = run_cli(["inspect-buffer", str(run), f"hydra.run.dir={tmp_path / 'h'}"])
    assert text.returncode == 0 and "100,000" in text.stdout
    assert time.perf_counter() - t0 < 60


def test_a_buffer_index_out_of_bounds_is_one_line_exit_2(tmp_path: Path) -> None:
    """The bound on the group size was caught in load_buffer but escaped as a ValueError traceback
    (issue 46): now exit 2 and one line, as resume refuses the same buffer."""
    from exgrpo_cli.checkpoint import store as ckpt

    run = tmp_path / "run"
    small = _synthetic_checkpoint(tmp_path / "src", 20) / "checkpoints" / "step_40"

    def write(tmp: Path) -> None:
        for part in ("replay", "trainer_state.json"):
            src = small / part
            if src.is_dir():
                (tmp / part).mkdir()
                for f in src.iterdir():
                    (tmp / part / f.name).write_bytes(f.read_bytes())
            else:
                (tmp / part).write_bytes(src.read_bytes())
        index = json.loads((tmp / "replay" / "index.json").read_text())
        index["group_size"] = 10**8
        (tmp / "replay" / "index.json").write_text(json.dumps(index))

    assert ckpt.save_checkpoint(run / "checkpoints", 40, write, keep=1) is not None
    res = run_cli(["inspect-buffer", str(run), f"hydra.run.dir={tmp_path / 'h'}"])
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "group size" in lines[0] and "Traceback" not in res.stderr, res.stderr
