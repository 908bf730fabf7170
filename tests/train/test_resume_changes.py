"""Resume says what changed (issue 46, item 2): a checkpoint keeps the config it was trained with
(config.json, read back as data); a resume whose reward, replay, algo, model, data or rollout keys
differ is refused in one line naming each key unless trainer.resume_changes=true confirms it; the
keys that cannot change the objective (steps, logging, eval cadence) are never compared, and a
SLURM-style resume with the same command resumes as before."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.run.resume_changes import CONFIG_FILE, changes, check_resume_changes, trained_with

from conftest import ONPOLICY_RUN, SharedRun, metrics, run_cli
from shared_artefacts import private_copy


def _cfg(**sections: dict[str, object]) -> ExgrpoConfig:
    cfg = ExgrpoConfig()
    for name, values in sections.items():
        cfg = dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **values)})
    return cfg


def _checkpoint(folder: Path, cfg: ExgrpoConfig) -> Path:
    folder.mkdir(parents=True)
    (folder / CONFIG_FILE).write_text(json.dumps(trained_with(cfg)))
    return folder


def test_a_resume_with_the_default_reward_is_refused_naming_the_keys(tmp_path: Path) -> None:
    """The old resume continued a reward=python run on the math reward without a word."""
    first = _cfg(reward={"kind": "python", "function": "my_reward.py:score"}, replay={"beta": 0.2})
    folder = _checkpoint(tmp_path / "step_2", first)
    with pytest.raises(ckpt.ResumeRefused) as refused:
        check_resume_changes(ExgrpoConfig(), folder)
    message = str(refused.value)
    assert "\n" not in message and "trainer.resume_changes=true" in message, message
    for key in ("reward.kind: python -> math", "reward.function: my_reward.py:score -> ", "replay.beta: 0.2"):
        assert key in message, message
    confirmed = _cfg(trainer={"resume_changes": True})
    note = check_resume_changes(confirmed, folder)
    assert note is not None and "reward.kind" in note and "replay.beta" in note


def test_steps_logging_and_eval_cadence_are_never_compared(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "step_2", ExgrpoConfig())
    later = _cfg(trainer={"steps": 500, "eval_every": 7, "save_every": 3}, logger={"console": False})
    assert check_resume_changes(later, folder) is None
    faster = _cfg(rollout={"gpu_memory_utilization": 0.5}, algo={"micro_batch_tokens": 123})
    assert check_resume_changes(faster, folder) is None  # speed and memory only


def test_a_checkpoints_config_is_data_shown_short_and_on_one_line() -> None:
    saved = trained_with(ExgrpoConfig())
    saved["reward"]["function"] = "x.py:f\n" + "A" * 500  # someone else's text
    saved["algo"]["lr"] = [1, 2]
    saved["algo"]["a_key_of_another_version"] = 3  # not compared: absent from this version
    found = changes(saved, trained_with(ExgrpoConfig()))
    assert f"algo.lr: [1, 2] -> {ExgrpoConfig().algo.lr}" in found
    assert not any("a_key_of_another_version" in f for f in found)
    line = next(f for f in found if f.startswith("reward.function"))
    assert "\n" not in line and len(line) < 120, line


@pytest.mark.parametrize("command", [{"math": 1.0}, {}, {"math": 1.0, "choice": 2.0}])
def test_reward_components_are_compared_whole(tmp_path: Path, command: dict[str, float]) -> None:
    """A mapping of the user's own keys is one setting. The old comparison opened it key by key and
    compared only the keys of both sides: {math: 1, choice: 0.5} resumed with {math: 1} or the
    default {} was accepted without a word."""
    folder = _checkpoint(tmp_path / "step_2", _cfg(reward={"components": {"math": 1.0, "choice": 0.5}}))
    with pytest.raises(ckpt.ResumeRefused) as refused:
        check_resume_changes(_cfg(reward={"components": command}), folder)
    message = str(refused.value)
    assert 'reward.components: {"math": 1.0, "choice": 0.5} -> ' in message and "\n" not in message, message
    same = _cfg(reward={"components": {"choice": 0.5, "math": 1}})  # order and 1 vs 1.0: the same
    assert check_resume_changes(same, folder) is None


def test_a_key_added_since_the_checkpoint_is_not_a_change() -> None:
    """A field exgrpo added after the checkpoint was written (a dict-valued one, or a whole new
    subsection) is absent from its config: not compared, whatever the command sets."""
    saved = trained_with(ExgrpoConfig())
    del saved["reward"]["components"]
    del saved["model"]["lora"]
    command = trained_with(_cfg(reward={"components": {"math": 1.0}}))
    assert changes(saved, command) == []
    saved["reward"]["components"] = {}  # present in both: compared
    assert changes(saved, command) == ['reward.components: {} -> {"math": 1.0}']


@pytest.mark.parametrize("kind", ["missing", "fifo", "not-a-mapping", "not-json"])
def test_an_unreadable_config_is_refused_and_a_missing_one_is_a_warning(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "step_1"
    folder.mkdir()
    path = folder / CONFIG_FILE
    if kind == "fifo":
        os.mkfifo(path)  # read without blocking
    elif kind == "not-a-mapping":
        path.write_text("[1]")
    elif kind == "not-json":
        path.write_text("{'reward': ")
    if kind == "missing":
        note = check_resume_changes(ExgrpoConfig(), folder)
        assert note is not None and "not compared" in note
        return
    # a config that verified but does not read is a checkpoint that does not load: resume=auto
    # quarantines it and falls back (run/training.py), an explicit path is refused
    with pytest.raises(ckpt.CheckpointLoadError, match=CONFIG_FILE):
        check_resume_changes(ExgrpoConfig(), folder)


def _without_ratio() -> list[str]:
    """The on-policy run's command without replay.ratio=0 (the default 0.5 applies) nor its steps."""
    return [o for o in ONPOLICY_RUN if o != "replay.ratio=0" and not o.startswith("trainer.steps")]


@pytest.mark.slow
def test_resume_through_the_cli_with_another_replay_ratio_is_refused(
    onpolicy_run: SharedRun, tmp_path: Path
) -> None:
    """A copy of a 2-step on-policy run (replay.ratio=0) resumed by the default command
    (replay.ratio=0.5): refused at start-up in one line, before the logger writes a row."""
    out = private_copy(onpolicy_run.dir, tmp_path / "run")
    assert (out / "checkpoints" / "step_2" / CONFIG_FILE).is_file()
    rows = len(metrics(out))
    res = run_cli(["train", f"hydra.run.dir={out}", *_without_ratio(), "trainer.steps=3"])
    assert res.returncode == 2, res.stderr[-2000:]
    refusal = [line for line in res.stderr.splitlines() if line.startswith("exgrpo train:")]
    assert len(refusal) == 1 and "replay.ratio: 0.0 -> 0.5" in refusal[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr and len(metrics(out)) == rows


@pytest.mark.slow
@pytest.mark.long  # two resumed runs: make test-long
def test_a_slurm_requeue_resumes_and_a_confirmed_change_resumes(
    onpolicy_run: SharedRun, tmp_path: Path
) -> None:
    """The same command again under a SLURM job id resumes as before; a change confirmed with
    trainer.resume_changes=true resumes too, the warning naming it."""
    out = private_copy(onpolicy_run.dir, tmp_path / "run")
    same = [o for o in ONPOLICY_RUN if not o.startswith("trainer.steps")]
    slurm = {"SLURM_JOB_ID": "77"}  # a requeued job: the same command again
    res = run_cli(["train", f"hydra.run.dir={out}", *same, "trainer.steps=3"], env_extra=slurm)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "resumed from" in res.stdout + res.stderr and metrics(out)[-1]["step"] == 3
    confirmed = [*_without_ratio(), "trainer.steps=4", "trainer.resume_changes=true"]
    res = run_cli(["train", f"hydra.run.dir={out}", *confirmed])
    assert res.returncode == 0, res.stderr[-2000:]
    assert "replay.ratio: 0.0 -> 0.5" in res.stdout + res.stderr and metrics(out)[-1]["step"] == 4
