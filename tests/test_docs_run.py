"""Every documented command classified RUN or DRY in tests/doc_checks.py runs on the CPU, in one
process (tests/doc_run_driver.py), in its cheap form: the printed command, then the small sizes
of its `cheap` entry, then a run dir under tmp. Two short training runs come first; the commands
that read a run (`outputs/train/<run>`, a checkpoint, an eval's generations) read those."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from doc_checks import COMMANDS, DRY, RUN, SCRIPT, command_argv

from conftest import REPO, SHARED_DATA, cli_env

pytestmark = pytest.mark.slow

TRAIN_FIRST = ("exgrpo train", "exgrpo train replay.ratio=0")
# Beyond small sizes, the first run needs what later commands read: a replay buffer from step 1
# (inspect-buffer) and a best checkpoint (`eval model.path=<run>/checkpoints/best/model`).
FIRST_RUN_NEEDS = ("replay.start_threshold=0", "trainer.keep_best=true")


def _substitutions(tmp: Path) -> dict[str, str]:
    run_a, run_b = tmp / "runs" / "exgrpo", tmp / "runs" / "grpo"
    return {
        "outputs/train/<run>/checkpoints/step_40": f"{run_a}/checkpoints/step_2",  # the run's last step
        "outputs/train/<run>": str(run_a),
        "<run>/checkpoints/best/model": f"{run_a}/checkpoints/best/model",
        "outputs/eval/<run>/generations.jsonl": str(tmp / "runs" / "eval" / "generations.jsonl"),
        "outputs/train/grpo": str(run_b),
        "outputs/train/exgrpo": str(run_a),
        "outputs/strong-start/checkpoints/step_60/model": f"{run_a}/checkpoints/step_2/model",
        "inspect.show=syn-02689": f"inspect.show={{buffered:{run_a}}}",  # a question this run buffered
        "docs/examples/": f"{REPO}/docs/examples/",  # the page's files, from the runs' cwd (tmp)
    }


def _steps(tmp: Path) -> list[dict]:
    subs = _substitutions(tmp)
    run_dirs = {
        "exgrpo train": "runs/exgrpo",
        "exgrpo train replay.ratio=0": "runs/grpo",
        "exgrpo eval": "runs/eval",
    }
    order = [*TRAIN_FIRST, *(t for t in COMMANDS if t not in TRAIN_FIRST)]
    steps = []
    for i, text in enumerate(order):
        check = COMMANDS[text]
        if check.mode not in (RUN, DRY):
            continue
        argv = command_argv(text, subs) + list(check.cheap)
        if text == "exgrpo train":
            argv += FIRST_RUN_NEEDS
        if check.mode == DRY:
            argv.append("ablation.dry_run=true")
        cwd = tmp
        if "../shared/data" in text:  # relative to the repo root, as the page runs it
            if not (SHARED_DATA / "benchmarks").is_dir():
                continue
            cwd = REPO
        run_dir = tmp / run_dirs.get(text, f"runs/{i}")
        if "-m" in argv:  # a multirun: its runs go under the sweep dir (an override after -m)
            argv.append(f"hydra.sweep.dir={run_dir}")
        else:  # the run dir right after the command: Hydra's flags (--cfg job) end the command line
            argv.insert(1, f"hydra.run.dir={run_dir}")
        steps.append(
            {"id": text, "argv": argv, "cwd": str(cwd), "dry": check.mode == DRY, "capture": bool(check.says)}
        )
    return steps


def _write_custom_suite(tmp: Path) -> None:
    """my_test.parquet of `exgrpo eval eval=custom eval.path=my_test.parquet ...`: 4 questions."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pairs = [(3, 4), (12, 30), (7, 8), (25, 25)]
    table = pa.table(
        {"problem": [f"What is {a}+{b}?" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]}
    )
    pq.write_table(table, tmp / "my_test.parquet")


@pytest.mark.long  # make test-all only (docs/testing.md)
def test_documented_cpu_commands_run(tmp_path: Path):
    _write_custom_suite(tmp_path)
    steps = _steps(tmp_path)
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    results_path = tmp_path / "results.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "doc_run_driver.py"),
            str(tmp_path / "steps.json"),
            str(results_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=cli_env() | {"PYTHONPATH": str(REPO)},
    )
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    log = proc.stdout[-6000:] + proc.stderr[-4000:]
    missing = [s["id"] for s in steps if s["id"] not in results]
    assert not missing, f"the driver stopped before {missing}:\n{log}"
    failed = {text: r for text, r in results.items() if r["rc"] != COMMANDS[text].rc or r.get("errors")}
    assert not failed, f"documented commands that failed in their cheap form: {failed}\n{log}"
    for text, r in results.items():
        says = COMMANDS[text].says
        assert says in r.get("output", ""), f"`{text}` did not say {says!r}: {r.get('output', '')[-2000:]}"
        if COMMANDS[text].mode == DRY:
            assert r["composed"] >= 1, f"`{text}`: its dry run printed no `exgrpo train` command"
    # what the runs were meant to leave for the commands after them
    assert (tmp_path / "runs" / "exgrpo" / "checkpoints" / "best" / "model").is_dir()
    assert (tmp_path / "runs" / "eval" / "generations.jsonl").is_file()


def test_documented_python_scripts_answer_help():
    for text, check in COMMANDS.items():
        if check.mode == SCRIPT and ".py" in text:
            script = next(a for a in text.split() if a.endswith(".py"))
            proc = subprocess.run(
                [sys.executable, str(REPO / script), "--help"],
                capture_output=True,
                text=True,
                timeout=300,
                cwd=REPO,
            )
            assert proc.returncode == 0, f"`{text}`: {script} --help failed:\n{proc.stderr[-2000:]}"
