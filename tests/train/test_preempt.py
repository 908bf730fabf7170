"""Signals and requeue (issue #23 point 2): a stop signal becomes a flag checked at the step's
end; after a scheduler's warning (SIGUSR1/SIGUSR2) the job is requeued, by submitit's handler
under submitit, else by `scontrol requeue` (a stub on PATH here) when trainer.slurm_requeue asks;
a SLURM job's default run dir is named after the job so that the requeued job resumes in it."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from slurm_stub import stub_scontrol

from exgrpo_cli.errors import ExgrpoError
from exgrpo_cli.host import run_name, slurm_job_id
from exgrpo_cli.run import preempt
from exgrpo_cli.run.preempt import STOP, STOP_AND_REQUEUE, StopRequested


@pytest.fixture
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    # EXGRPO_COMMAND: the run dir's command part, which an in-process CLI call may have left set
    names = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SUBMITIT_FOLDER", "EXGRPO_COMMAND")
    for var in names:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_a_warning_asks_for_a_requeue_and_repeats_do_not_abort() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    with StopRequested() as stop:
        assert not stop.flag and stop.code == 0
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)  # forwarded again by a launcher: ignored
        os.kill(os.getpid(), signal.SIGTERM)  # and a stop after it: ignored too
        assert stop.signum == signal.SIGUSR1 and stop.code == STOP_AND_REQUEUE
        stop.agree(STOP)
        assert stop.flag and stop.requeue and "SIGUSR1 came" in stop.since()
    assert signal.getsignal(signal.SIGUSR1) == before


def test_entered_twice_the_handlers_go_in_once_and_come_back_at_the_end() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    with StopRequested() as stop:
        with stop:  # the step loop inside the run
            pass
        assert signal.getsignal(signal.SIGUSR2) == stop._handle
        assert stop.displaced()[signal.SIGUSR2] == before  # not its own handler
    assert signal.getsignal(signal.SIGUSR2) == before


def test_a_rank_the_signal_missed_stops_and_requeues_with_the_others() -> None:
    with StopRequested() as stop:
        stop.agree(0)
        assert not stop.flag
        stop.agree(STOP_AND_REQUEUE)
        assert stop.flag and stop.requeue and stop.since() == ""


def test_sigterm_stops_without_requeue_and_a_second_ctrl_c_aborts() -> None:
    with StopRequested() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        stop.agree(stop.code)
        assert stop.flag and not stop.requeue
    with StopRequested() as stop, pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)


def test_run_name_is_the_slurm_job(no_slurm: pytest.MonkeyPatch) -> None:
    assert slurm_job_id() is None and not run_name().startswith("slurm-")
    no_slurm.setenv("SLURM_JOB_ID", "4242")
    assert run_name() == "slurm-4242"
    no_slurm.setenv("SLURM_ARRAY_JOB_ID", "4200")
    no_slurm.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert slurm_job_id() == "4200_3" and run_name() == "slurm-4200_3"


def test_the_default_run_dir_of_a_slurm_job(no_slurm: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from exgrpo_cli.config.paths import config_dir
    from exgrpo_cli.config.schema import register_configs
    from exgrpo_cli.host import register_run_name_resolver

    register_configs()
    register_run_name_resolver()  # as the CLI does
    no_slurm.setenv("SLURM_JOB_ID", "77")
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = compose(config_name="config", return_hydra_config=True)
    assert OmegaConf.select(cfg, "hydra.run.dir") == "outputs/train/slurm-77"


def test_scontrol_requeue_through_a_stub(tmp_path: Path, no_slurm: pytest.MonkeyPatch) -> None:
    calls = stub_scontrol(tmp_path / "bin")
    no_slurm.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    no_slurm.setenv("SLURM_JOB_ID", "4242")
    assert "no requeue" in preempt.requeue_after_stop({}, slurm_requeue=False)
    assert not calls.exists()
    assert preempt.requeue_after_stop({}, slurm_requeue=True) == "requeued SLURM job 4242"
    assert calls.read_text().split("\n")[0] == "requeue 4242"
    refusing = stub_scontrol(tmp_path / "bad", exit_code=1)
    no_slurm.setenv("PATH", f"{tmp_path / 'bad'}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ExgrpoError, match="scontrol requeue 4242 failed .*stub refused"):
        preempt.requeue_after_stop({}, slurm_requeue=True)
    assert refusing.read_text().strip() == "requeue 4242"
    no_slurm.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ExgrpoError, match="scontrol is not on PATH"):
        preempt.requeue_after_stop({}, slurm_requeue=True)


def test_under_submitit_its_own_handler_requeues(tmp_path: Path, no_slurm: pytest.MonkeyPatch) -> None:
    got: list[Any] = []
    handlers = {signal.SIGUSR1: signal.SIG_DFL, signal.SIGUSR2: lambda s, f: got.append(s)}
    calls = stub_scontrol(tmp_path / "bin")
    no_slurm.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    no_slurm.setenv("SLURM_JOB_ID", "4242")
    no_slurm.setenv("SUBMITIT_FOLDER", str(tmp_path))
    assert preempt.requeue_after_stop(handlers, slurm_requeue=True) == "requeued by submitit"
    assert got == [signal.SIGUSR2] and not calls.exists()


def test_the_step_a_rank_died_in(tmp_path: Path) -> None:
    from exgrpo_cli.run.rank_failure import step_in_flight

    assert step_in_flight(tmp_path, 10) == "before step 1 (while starting)"
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n')
    assert step_in_flight(tmp_path, 10) == "during step 3"
    (tmp_path / "checkpoints" / ".tmp-step_2").mkdir(parents=True)
    assert step_in_flight(tmp_path, 10) == "while writing step 2's checkpoint"
    assert step_in_flight(tmp_path, 2) == "while writing step 2's checkpoint"
    (tmp_path / "checkpoints" / ".tmp-step_2").rmdir()
    assert step_in_flight(tmp_path, 2) == "after its last step (2)"
