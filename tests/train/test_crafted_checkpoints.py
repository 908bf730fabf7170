"""A run dir is data, round four: the quarantine note, a user's copy of a checkpoint folder, a
`checkpoints` that links to another run, a checkpoint whose state files verify but do not load, a
rank's log file. Every crafted entry is made here; a FIFO cannot block a test for ever
(`released_after` opens it after a few seconds, and the test then fails on its time bound)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from train.test_checkpoint import _write
from train.test_run_dir_specials import released_after

from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.checkpoint.store import ResumeRefused
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.errors import UsageError
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.run import training
from exgrpo_cli.run.resume import decide_resume

NOTE = "QUARANTINED.txt"


def _cfg(out: Path, **trainer: object) -> ExgrpoConfig:
    cfg = ExgrpoConfig()
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=str(out), **trainer))


# ----------------------------------------------------------------------------- the quarantine note


@pytest.mark.parametrize("kind", ["symlink", "fifo", "hardlink"])
def test_the_quarantine_note_never_writes_through_a_crafted_entry(tmp_path: Path, kind: str) -> None:
    """The old note was Path.write_text: a symlink named QUARANTINED.txt had its target overwritten
    (outside the run dir), a FIFO blocked the start for ever."""
    root = tmp_path / "run" / "checkpoints"
    ckpt.save_checkpoint(root, 1, _write("one"), keep=3)
    bad = ckpt.save_checkpoint(root, 3, _write("three"), keep=3)
    assert bad is not None
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    note = bad / NOTE
    if kind == "symlink":
        note.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(note)
    else:  # a regular file that verify accepts as a sidecar, sharing its bytes with the victim
        os.link(victim, note)
        (bad / "payload.txt").write_text("rotten")  # so that step_3 fails on its checksum
    t0 = time.monotonic()
    with released_after(tmp_path):
        found, warnings = ckpt.latest_verified(root)
    assert time.monotonic() - t0 < 3
    assert found == root / "step_1" and len(warnings) == 1, warnings
    assert victim.read_text() == "precious"
    written = root / "corrupt-step_3" / NOTE
    assert written.is_file() and not written.is_symlink() and written.stat().st_nlink == 1
    assert "step_3" in written.read_text()


def test_a_quarantine_whose_note_cannot_be_written_still_quarantines(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    bad = ckpt.save_checkpoint(root, 2, _write("two"), keep=2)
    assert bad is not None
    (bad / NOTE).mkdir()  # a folder of that name is never removed
    target = ckpt.quarantine(bad, "test: rotten")
    assert target == root / "corrupt-step_2" and (target / NOTE).is_dir()


# ----------------------------------------------------------------------------- a user's copies


def test_a_copy_named_step_star_is_neither_resumed_nor_pruned(tmp_path: Path) -> None:
    """`cp -r step_2 step_2.bak`: the old _step_of raised ValueError (int('2.bak')) at every start
    and at every save's pruning."""
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        ckpt.save_checkpoint(root, step, _write(str(step)), keep=2)
    for copy in ("step_2.bak", "step_9-old", "step_"):
        shutil.copytree(root / "step_2", root / copy)
    (root / ckpt.LATEST).write_text("step_9-old")  # a pointer to the copy is not followed to it
    assert ckpt.resume_candidates(root) == [root / "step_2", root / "step_1"]
    assert decide_resume(_cfg(tmp_path), DataParallel())[0] == root / "step_2"
    for step in (3, 4):
        ckpt.save_checkpoint(root, step, _write(str(step)), keep=2)
    names = sorted(p.name for p in root.iterdir() if p.name.startswith("step_"))
    assert names == ["step_", "step_2.bak", "step_3", "step_4", "step_9-old"]


def test_resume_never_names_a_copy_before_deleting_it(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    ckpt.save_checkpoint(root, 1, _write("one"), keep=2)
    (root / "step_1").rename(root / "step_1.bak")
    with pytest.raises(ResumeRefused, match=r"step_1\.bak"):
        decide_resume(_cfg(tmp_path, resume="never"), DataParallel())
    assert (root / "step_1.bak" / ckpt.COMPLETE).is_file()


# ----------------------------------------------------------------------------- checkpoints/ a link


def _other_run(tmp_path: Path) -> tuple[Path, list[str]]:
    """Another run's checkpoints, with a torn write a start would remove, and what it holds."""
    other = tmp_path / "other_run" / "checkpoints"
    for step in (1, 2):
        ckpt.save_checkpoint(other, step, _write(str(step)), keep=2)
    (other / ".tmp-step_3").mkdir()
    return other, sorted(str(p.relative_to(other)) for p in other.rglob("*"))


@pytest.mark.parametrize("resume", ["auto", "never"])
def test_a_checkpoints_link_to_another_run_is_refused_before_anything(tmp_path: Path, resume: str) -> None:
    """resume=never overwrite=true: the old rmtree of the link raised OSError (a traceback);
    resume=auto resumed the other run's checkpoint, and would have pruned and deleted there."""
    other, before = _other_run(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(Path("..") / "other_run" / "checkpoints")
    with pytest.raises(ResumeRefused, match="is a symlink") as refused:
        decide_resume(_cfg(run, resume=resume, overwrite=True), DataParallel())
    assert "\n" not in str(refused.value)
    assert sorted(str(p.relative_to(other)) for p in other.rglob("*")) == before
    assert (run / "checkpoints").is_symlink()


def test_a_checkpoints_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").write_text("not a folder")
    with pytest.raises(ResumeRefused, match="is a file"):
        decide_resume(_cfg(tmp_path, resume="never", overwrite=True), DataParallel())
    assert (tmp_path / "checkpoints").read_text() == "not a folder"


def test_exgrpo_train_refuses_a_checkpoints_link_in_one_line(tiny_model: Path, tmp_path: Path) -> None:
    from conftest import SMALL_RUN, run_cli

    other, before = _other_run(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(other)
    res = run_cli(["train", f"hydra.run.dir={run}", *SMALL_RUN], timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines() == [
        f"exgrpo train: {run / 'checkpoints'} is a symlink, where a run dir holds its own checkpoints "
        "folder (a link would resume, prune and delete another folder's checkpoints): remove it, or "
        "use another run dir"
    ], res.stderr[-2000:]
    assert sorted(str(p.relative_to(other)) for p in other.rglob("*")) == before


# ----------------------------------------------------------------------------- verifies, does not load


def _state_files(folder: Path, n: int, state: Any, index: Any, config: Any = None) -> None:
    (folder / "replay").mkdir()
    (folder / "trainer_state.json").write_text(json.dumps(state))
    (folder / "replay" / "index.json").write_text(json.dumps(index))
    if config is not None:  # the config the checkpoint was trained with (run/resume_changes.py)
        (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("broken", ["empty-index", "state-not-a-mapping", "config-not-a-mapping"])
def test_a_checkpoint_whose_state_files_do_not_load_is_quarantined_and_fallen_back_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """The buffer check ran before the quarantine's `try`: a checkpoint that verifies but whose
    replay/index.json is [] (or trainer_state.json a list) made resume=auto exit 1 at every start."""
    cfg = _cfg(tmp_path)
    n, root = cfg.rollout.n, tmp_path / "checkpoints"
    good = {"format_version": 1, "group_size": n}
    ckpt.save_checkpoint(root, 1, lambda tmp: _state_files(tmp, n, {"step": 1}, good), keep=2)
    state, index, config = {
        "empty-index": ({"step": 2}, [], None),
        "state-not-a-mapping": ([2], good, None),
        "config-not-a-mapping": ({"step": 2}, good, [1]),
    }[broken]
    ckpt.save_checkpoint(root, 2, lambda tmp: _state_files(tmp, n, state, index, config), keep=2)
    says = "is not a mapping of config sections" if broken == "config-not-a-mapping" else "does not load"
    built: list[Path | None] = []

    class Logger:
        wandb_id = None

        def close(self) -> None:
            pass

    def build(cfg: ExgrpoConfig, device: Any, parallel: Any, resume_from: Path | None, *rest: Any) -> Any:
        built.append(resume_from)
        return "trainer", [], "report"

    monkeypatch.setattr(training, "load_run_data", lambda cfg, parallel: ([], [], None))
    monkeypatch.setattr(training, "_start_logger", lambda *args: Logger())
    monkeypatch.setattr(training, "build_trainer", build)
    started = training._start(cfg, DataParallel(), tmp_path)
    assert started[4] == root / "step_1" and built == [root / "step_1"]
    assert says in (root / "corrupt-step_2" / NOTE).read_text()
    assert any("quarantined as corrupt-step_2" in note for note in started[5]), started[5]
    # an explicit trainer.resume=<that checkpoint> is refused (exit 2), nothing renamed
    shutil.copytree(root / "corrupt-step_2", tmp_path / "copy")
    (tmp_path / "copy" / NOTE).unlink()
    explicit = _cfg(tmp_path / "other", resume=str(tmp_path / "copy"))
    with pytest.raises(ResumeRefused, match=says):
        training._start(explicit, DataParallel(), tmp_path / "other")
    assert (tmp_path / "copy" / ckpt.COMPLETE).is_file()


# ----------------------------------------------------------------------------- a rank's log


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_special_file_at_a_ranks_log_is_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """The old rank opened train.rank<k>.log with logging.FileHandler: a FIFO blocked that rank in
    open() until the process group's timeout, a link appended to the file it named."""
    from exgrpo_cli.commands.train import rank_main

    log = tmp_path / "train.rank1.log"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    if kind == "fifo":
        os.mkfifo(log)
    else:
        log.symlink_to(victim)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(training, "run_training", lambda cfg: pytest.fail("the rank went on"))
    t0 = time.monotonic()
    with released_after(tmp_path), pytest.raises(SystemExit) as ended:
        rank_main(_cfg(tmp_path))
    assert time.monotonic() - t0 < 3 and ended.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [
        f"exgrpo train: {log} is a {'FIFO' if kind == 'fifo' else 'symlink'}, where a run dir holds "
        "a regular file: remove it, or use another run dir"
    ], said
    assert victim.read_text() == "precious"


def test_a_ranks_log_opens_as_a_plain_file(tmp_path: Path) -> None:
    import logging

    from exgrpo_cli.run.log_files import open_log

    path = tmp_path / "train.rank2.log"
    path.write_text("before\n")
    handler = open_log(path)
    handler.emit(logging.LogRecord("x", logging.INFO, __file__, 1, "a line", None, None))
    handler.close()
    assert path.read_text() == "before\na line\n"
    os.mkfifo(tmp_path / "pipe.log")
    with released_after(tmp_path), pytest.raises(UsageError, match="is a FIFO"):
        open_log(tmp_path / "pipe.log")


@pytest.mark.slow
def test_exgrpo_train_falls_back_from_a_checkpoint_whose_buffer_index_is_empty(
    onpolicy_run: Any, tmp_path: Path
) -> None:
    """Through the CLI: the crafted step_2 (its index [] and its manifest rewritten, as the run's
    author can) is quarantined, and the run resumes from the older copy of it (step_1)."""
    from train.test_run_is_data_e2e import _rehash

    from conftest import train_ok
    from shared_artefacts import private_copy

    out = private_copy(onpolicy_run.dir, tmp_path / "run")
    root = out / "checkpoints"
    shutil.copytree(root / "step_2", root / "step_1")  # an older checkpoint to fall back to
    (root / "step_2" / "replay" / "index.json").write_text("[]")
    _rehash(root / "step_2")
    assert ckpt.verify(root / "step_2") is None
    train_ok(out, *onpolicy_run.overrides, "trainer.steps=3")
    log = (out / "train.log").read_text()
    assert "does not load" in log and f"resumed from {root / 'step_1'} (step 2)" in log
    assert "does not load" in (root / "corrupt-step_2" / NOTE).read_text()
