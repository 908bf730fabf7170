"""inspect-buffer under every replay method: a prompts-only buffer (replay.method=prompt, a real
run's checkpoint) and one holding solutions from elsewhere (no behaviour log-probs) are described
as what they are, without a traceback or a figure of zero responses, and the report names the
run's replay.method, read from the run's config as data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exgrpo_cli.inspection import report as rp
from exgrpo_cli.inspection.render import render_report
from exgrpo_cli.replay.buffer import ExperienceBuffer

from conftest import SharedRun, run_cli
from shared_artefacts import private_copy


def _inspect(*args: str, cwd: Path) -> str:
    res = run_cli(["inspect-buffer", *args, f"hydra.run.dir={cwd / 'hydra'}"], cwd=cwd)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


@pytest.mark.slow
def test_a_prompt_replay_runs_buffer_is_prompts_only(prompt_run: SharedRun, tmp_path: Path) -> None:
    run_dir = private_copy(prompt_run.dir, tmp_path / "run")
    buf = ExperienceBuffer.load(str(run_dir / "checkpoints/step_3/replay"))
    assert buf.num_questions > 0 and buf.num_experiences == 0, "the scenario: questions, no response"
    rep = json.loads(_inspect(str(run_dir), "--json", "inspect.plot=true", cwd=tmp_path))
    assert rep["replay_method"] == "prompt" and rep["stores"] == "prompts only"
    assert rep["questions"] == buf.num_questions and rep["experiences"] == 0
    assert rep["response_length"]["count"] == 0 and rep["behavior_logp_mean"]["count"] == 0
    assert all(q["experiences"] == 0 and q["mean_length"] is None for q in rep["top_questions"])
    assert set(rep["method_state"]) == {"reuse", "last_replayed"}  # what prompt replay remembers
    assert Path(rep["plot"]).is_file()

    text = _inspect(str(run_dir), cwd=tmp_path)
    assert "replay method  prompt (from" in text and "prompts only" in text and "on-policy" in text
    # no distribution of responses that are not there, no "most experiences" table of zeros
    for absent in ("stored response length", "behaviour log-prob", "questions with the most experiences"):
        assert absent not in text, absent


def test_solutions_from_elsewhere_are_named_and_kept_out_of_the_log_prob_figures() -> None:
    """A response stored without a behaviour policy (another model's solution: NaN log-probs, as
    a guidance method stores a data column's text) is counted apart, not averaged in as NaN."""
    buf = ExperienceBuffer(group_size=4)
    own = (np.array([5, 6, 7], np.int32), np.array([-0.5, -1.0, -1.5], np.float32))
    other = (np.array([8, 9], np.int32), np.full(2, np.nan, np.float32))
    buf.observe_group("q1", 2, [own, other], step=1, collect=True)
    rep = rp.buffer_report(buf, {"step": 1})
    assert rep["experiences"] == 2 and rep["without_behavior_logp"] == 1
    assert rep["stores"] == "responses, some without behaviour log-probs (solutions from elsewhere)"
    assert rep["behavior_logp_mean"]["count"] == 1 and rep["behavior_logp_mean"]["mean"] == -1.0
    assert rp.stored_kind(3, 3, 3) == "responses without behaviour log-probs (solutions from elsewhere)"
    assert rp.stored_kind(0, 0, 0) == "empty"

    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render_report({"checkpoint": "ck", **rep}))
    text = console.export_text()
    assert "1 without behaviour log-probs (from elsewhere)" in text
    assert "(1 without one left out: solutions from elsewhere)" in text


def _run_with_config(root: Path, config: str) -> Path:
    ck = root / "checkpoints" / "step_1"
    ck.mkdir(parents=True)
    (root / ".hydra").mkdir()
    (root / ".hydra" / "config.yaml").write_text(config)
    return ck


def test_the_runs_method_is_read_as_data(tmp_path: Path) -> None:
    # a method named by a file is shown, never imported: importing this one would leave a marker
    marker = tmp_path / "imported"
    user = tmp_path / "mine.py"
    user.write_text(f"open({str(marker)!r}, 'w').close()\nclass Mine: ...\n")
    ck = _run_with_config(tmp_path / "a", f"replay:\n  method: {user}:Mine\n  ratio: 0.5\n")
    assert rp.run_replay_method(ck) == (f"{user}:Mine", str(tmp_path / "a/.hydra/config.yaml"))
    assert not marker.exists()
    # a run from before replay.method existed trained ExGRPO
    assert rp.run_replay_method(_run_with_config(tmp_path / "b", "replay:\n  ratio: 0.5\n"))[0] == "exgrpo"
    # no config beside the checkpoint, one that is not YAML of a config, or a link: unknown, said why
    lone = tmp_path / "lone" / "step_1"
    lone.mkdir(parents=True)
    assert rp.run_replay_method(lone) == (None, "unknown (no .hydra/config.yaml beside the checkpoint)")
    name, why = rp.run_replay_method(_run_with_config(tmp_path / "c", "- just\n- a list\n"))
    assert name is None and "could not be read" in why
    ck = _run_with_config(tmp_path / "d", "")
    (tmp_path / "d/.hydra/config.yaml").unlink()
    (tmp_path / "d/.hydra/config.yaml").symlink_to(tmp_path / "a/.hydra/config.yaml")
    name, why = rp.run_replay_method(ck)
    assert name is None and "could not be read" in why
