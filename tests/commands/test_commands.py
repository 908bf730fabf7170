"""`exgrpo_cli.commands`: dispatch checks the config before any command runs and turns library
errors into one stderr line and an exit code; `model.preset` names Hydra's choice; `exgrpo train`
reports on rank 0 only. The commands themselves are replaced by fakes: nothing loads a model."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import exgrpo_cli.commands.train as train_command
from exgrpo_cli import commands
from exgrpo_cli.commands.compose import with_overrides
from exgrpo_cli.config.paths import config_dir
from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig, register_configs
from exgrpo_cli.errors import ExgrpoError, UsageError, exit_on_error

from conftest import REPO, cli_env, run_cli

MODULES = {
    "train": "exgrpo_cli.commands.train",
    "eval": "exgrpo_cli.commands.eval",
    "ablate": "exgrpo_cli.commands.ablate",
    "inspect-buffer": "exgrpo_cli.commands.inspect_buffer",
}


def _compose(*overrides: str, hydra: bool = False) -> DictConfig:
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        return compose(
            config_name="config",
            overrides=[*overrides, "trainer.output_dir=/nonexistent/out"],
            return_hydra_config=hydra,
        )


class Recorder:
    """Stands in for a command's `run`; raises `error` when given one."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error
        self.calls: list[ExgrpoConfig] = []

    def __call__(self, cfg: ExgrpoConfig) -> None:
        self.calls.append(cfg)
        if self.error is not None:
            raise self.error


def _fake(monkeypatch: pytest.MonkeyPatch, command: str, error: BaseException | None = None) -> Recorder:
    rec = Recorder(error)
    monkeypatch.setattr(f"{MODULES[command]}.run", rec)
    return rec


@pytest.fixture(scope="module")
def default_cfg() -> DictConfig:
    return _compose()


# ----------------------------------------------------------------------------- dispatch


@pytest.mark.parametrize("command", list(MODULES))
def test_dispatch_runs_the_command_with_the_typed_config(
    command: str, default_cfg: DictConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recs = {c: _fake(monkeypatch, c) for c in MODULES}
    commands.dispatch(command, default_cfg)
    assert {c: len(r.calls) for c, r in recs.items()} == {c: int(c == command) for c in MODULES}
    (cfg,) = recs[command].calls
    assert isinstance(cfg, ExgrpoConfig)
    assert cfg.trainer.output_dir == "/nonexistent/out" and cfg.model.path == "builtin:tiny"
    assert capsys.readouterr() == ("", "")


class Interrupted(ExgrpoError):
    exit_code = 130


@pytest.mark.parametrize(
    "error,code",
    [
        (UsageError("no such file: /x/y.jsonl"), 2),
        (ConfigError("invalid eval.path='': allowed an existing file"), 2),
        (ExgrpoError("5 updates in a row were skipped"), 1),
        (Interrupted("stopped by a signal"), 130),
    ],
)
def test_library_errors_become_one_stderr_line_and_the_exit_code(
    error: ExgrpoError,
    code: int,
    default_cfg: DictConfig,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rec = _fake(monkeypatch, "eval", error)
    with pytest.raises(SystemExit) as exc:
        commands.dispatch("eval", default_cfg)
    assert exc.value.code == code and len(rec.calls) == 1
    assert exc.value.__cause__ is None and exc.value.__suppress_context__  # no traceback chain
    out = capsys.readouterr()
    assert out.err == f"exgrpo eval: {error}\n" and out.out == ""


def test_other_exceptions_are_not_swallowed(
    default_cfg: DictConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake(monkeypatch, "train", RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        commands.dispatch("train", default_cfg)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "override,message",
    [
        ("trainer.steps=0", "invalid trainer.steps=0: allowed >= 1"),
        ("replay.ratio=1.5", "invalid replay.ratio=1.5: allowed a number in [0, 1]"),
        ("logger.wandb.mode=sometimes", "invalid logger.wandb.mode='sometimes': allowed one of auto, online"),
    ],
)
def test_a_bad_value_exits_2_naming_the_key_before_the_command_runs(
    override: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = _fake(monkeypatch, "train")
    with pytest.raises(SystemExit) as exc:
        commands.dispatch("train", _compose(override))
    assert exc.value.code == 2 and rec.calls == []
    err = capsys.readouterr().err
    assert err.startswith(f"exgrpo train: {message}") and err.count("\n") == 1


def test_an_unknown_variant_exits_2_with_the_allowed_names(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = _fake(monkeypatch, "train")
    with pytest.raises(SystemExit) as exc:
        commands.dispatch("train", _compose("replay.trajectory_selection=bogus"))
    assert exc.value.code == 2 and rec.calls == []
    err = capsys.readouterr().err
    said = "exgrpo train: invalid replay.trajectory_selection='bogus': allowed one of "
    assert err.startswith(said) and err.endswith("\n") and err.count("\n") == 1
    allowed = err[len(said) : -1].split(", ")
    assert "lowest_entropy" in allowed  # ExGRPO's own rule
    for name in allowed:  # every name the message offers is one a run accepts
        commands.dispatch("train", _compose(f"replay.trajectory_selection={name}"))
    assert len(rec.calls) == len(allowed)
    assert [c.replay.trajectory_selection for c in rec.calls] == allowed


def test_the_real_cli_refuses_a_bad_value_before_loading(tmp_path: Path) -> None:
    res = run_cli(["train", "trainer.steps=0", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr == "exgrpo train: invalid trainer.steps=0: allowed >= 1\n"
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ----------------------------------------------------------------------------- model.preset


SetHydra = Callable[[DictConfig], None]


@pytest.fixture
def set_hydra_config() -> Iterator[SetHydra]:
    """Set HydraConfig by hand, as @hydra.main does; clear it afterwards."""
    hc = HydraConfig.instance()
    yield hc.set_config
    hc.cfg = None


def test_preset_is_filled_from_hydras_model_choice(set_hydra_config: SetHydra) -> None:
    set_hydra_config(_compose("model=qwen2.5-math-7b", "model.preset=", hydra=True))
    cfg = ExgrpoConfig()
    assert cfg.model.preset == ""
    named = commands.with_preset_name(cfg, commands.hydra_choices())
    assert named.model.preset == "qwen2.5-math-7b"
    assert cfg.model.preset == ""  # a copy: the input is unchanged
    assert named.model.path == cfg.model.path and named.replay == cfg.replay


def test_preset_set_by_the_yaml_or_the_user_is_kept(set_hydra_config: SetHydra) -> None:
    set_hydra_config(_compose("model=qwen2.5-math-7b", hydra=True))
    cfg = ExgrpoConfig()
    cfg.model.preset = "my-model"
    assert commands.with_preset_name(cfg, commands.hydra_choices()).model.preset == "my-model"


def test_preset_stays_empty_outside_hydra_main() -> None:
    with pytest.raises(ValueError):
        HydraConfig.get()
    cfg = ExgrpoConfig()
    assert commands.hydra_choices() == {}
    assert commands.with_preset_name(cfg, {}) is cfg


PRINT_PRESET = """
import sys
import exgrpo_cli.commands.inspect_buffer as command
command.run = lambda cfg: print("preset=" + cfg.model.preset)
from exgrpo_cli.cli.main import main
main(sys.argv[1:])
"""


def test_the_real_cli_names_the_preset_hydra_chose(tmp_path: Path) -> None:
    """Through @hydra.main and dispatch, with the command replaced: the YAML's own `preset:` is
    blanked, so only Hydra's choice can name it. (inspect-buffer: a command whose start-up
    checks import no torch; every command goes through the same dispatch.)"""
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            PRINT_PRESET,
            "inspect-buffer",
            "model=qwen2.5-math-7b",
            "model.preset=",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout == "preset=qwen2.5-math-7b\n"


# ----------------------------------------------------------------------------- exgrpo train


FINAL = {"val/accuracy": 0.5, "loss/total": -0.25, "reward/accuracy": 2 / 3}


@pytest.mark.parametrize("rank", [None, "0", "1", "3"])
def test_train_prints_the_summary_on_rank_0_only(
    rank: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import exgrpo_cli.run.training as train_run

    calls: list[ExgrpoConfig] = []

    def fake_training(cfg: ExgrpoConfig) -> dict[str, float]:
        calls.append(cfg)
        return dict(FINAL)

    monkeypatch.setattr(train_run, "run_training", fake_training)
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    cfg = ExgrpoConfig()
    train_command.run(cfg)
    assert calls == [cfg]
    out = capsys.readouterr()
    summary = "exgrpo train done: loss/total=-0.2500  reward/accuracy=0.6667  val/accuracy=0.5000\n"
    assert out.out == (summary if rank in (None, "0") else "")
    assert out.err == ""


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_plan_that_does_not_fit_is_said_by_rank_0_and_refused_by_every_rank(
    rank: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under torchrun each rank plans before it trains: all exit 2, only rank 0 shows the plan and
    says why (through the handler; the command itself never exits)."""
    from exgrpo_cli import plan
    from exgrpo_cli.plan import inputs

    def does_not_fit(*args: object, echo: Callable[[str], None], **kwargs: object) -> None:
        echo("the plan's table")
        raise plan.PlanDoesNotFit("the memory plan does not fit 1 x 80 GiB GPUs")

    monkeypatch.setattr(plan, "resolve_architecture", lambda *a, **k: None)
    monkeypatch.setattr(plan, "visible_devices", lambda *a, **k: None)
    monkeypatch.setattr(inputs, "uses_cuda", lambda cfg: True)
    monkeypatch.setattr(plan, "check_memory", does_not_fit)
    monkeypatch.setenv("RANK", rank)
    with pytest.raises(ExgrpoError) as err:
        train_command.run(ExgrpoConfig())
    assert err.value.exit_code == 2
    with pytest.raises(SystemExit) as exc, exit_on_error("train", say=rank == "0"):
        raise err.value
    out = capsys.readouterr()
    assert exc.value.code == 2
    said = ("the plan's table\n", "exgrpo train: the memory plan does not fit 1 x 80 GiB GPUs\n")
    assert (out.out, out.err) == (said if rank == "0" else ("", ""))


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_rank_that_crashes_logs_the_traceback_and_exits_1_without_a_line(
    rank: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import logging

    import exgrpo_cli.run.training as train_run

    def crash(cfg: ExgrpoConfig) -> dict[str, float]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(train_run, "run_training", crash)
    monkeypatch.setenv("RANK", rank)
    cfg = ExgrpoConfig()
    cfg.trainer.output_dir = str(tmp_path)
    root, before = logging.getLogger(), list(logging.getLogger().handlers)
    try:
        with pytest.raises(SystemExit) as exc:
            train_command.rank_main(cfg)
    finally:
        for h in set(root.handlers) - set(before):  # rank_logging's file handler
            root.removeHandler(h)
            h.close()
    assert exc.value.code == 1 and capsys.readouterr().err == ""
    log = (tmp_path / ("train.log" if rank == "0" else f"train.rank{rank}.log")).read_text()
    assert f"rank {rank} failed" in log and "RuntimeError: a bug" in log


def test_commands_never_exit_nor_read_the_rank_themselves() -> None:
    """Exit codes come from `errors.exit_on_error` alone, the rank from `train.launch.launched_rank`."""
    import ast

    for path in sorted((REPO / "exgrpo_cli" / "commands").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                assert not (isinstance(raised, ast.Name) and raised.id == "SystemExit"), path.name
            if isinstance(node, ast.Constant):
                assert node.value != "RANK", path.name


FIXES = (
    "rollout.sleep_mode=true",
    "model.gradient_checkpointing=true",
    "algo.micro_batch_tokens=9216",
    "trainer.offload=all",
    "rollout.gpu_memory_utilization=0.4",
    "trainer.plan_devices=4x80",
)


def test_a_fix_applied_to_the_typed_config_equals_the_config_hydra_composes() -> None:
    """What the plan's verifier does instead of composing again: the same config, no Hydra."""
    run = ("experiment=paper-qwen2.5-math-7b", "trainer.dry_run=true", "trainer.plan_devices=1x80")
    cfg = commands.to_typed(_compose(*run))
    assert with_overrides(cfg, FIXES) == commands.to_typed(_compose(*run, *FIXES))
    assert cfg.trainer.offload == "none" and cfg.trainer.plan_devices == "1x80"  # the run's own: untouched
    with pytest.raises(ConfigError, match="algo.micro_batch_tokens"):
        with_overrides(cfg, ["algo.micro_batch_tokens=many"])
    with pytest.raises(ConfigError, match="no_such_key"):
        with_overrides(cfg, ["algo.no_such_key=1"])
