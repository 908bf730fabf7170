"""Replay methods (replay/methods.py): the registry, the user's method from a file, and the step
calling the method's hooks on the real path (docs/replay-methods.md)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from exgrpo_cli.commands.variants import check_variants
from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig
from exgrpo_cli.replay.experience import Experience
from exgrpo_cli.replay.method_registry import REPLAY_METHODS, build_replay_method
from exgrpo_cli.replay.methods import ExgrpoReplay, Members

from conftest import REPLAY_RUN, REPO, metrics, run_cli, train_ok

# the worked example of docs/replay-methods.md: ExGRPO, but one replayed question a step, its
# newest stored response beside K-1 fresh ones
EXAMPLE = REPO / "docs" / "examples" / "one_newest.py"
USER_METHOD = EXAMPLE.read_text()


def test_the_docs_show_the_example_file() -> None:
    assert USER_METHOD in (REPO / "docs" / "replay-methods.md").read_text()


def _cfg(method: str) -> ExgrpoConfig:
    cfg = ExgrpoConfig()
    cfg.replay.method = method
    return cfg


def test_exgrpo_is_the_default_and_an_entry() -> None:
    assert ExgrpoConfig().replay.method == "exgrpo"
    assert type(build_replay_method(ExgrpoConfig())) is REPLAY_METHODS["exgrpo"] is ExgrpoReplay


def test_exgrpo_replays_one_stored_response_beside_k_minus_1_fresh() -> None:
    method = ExgrpoReplay(_cfg("exgrpo"))  # lowest_entropy: the candidate of the lowest score
    cands = [Experience(np.array([i + 1], np.int32), np.zeros(1, np.float32), step=i) for i in range(3)]
    assert method.members(cands, [0.7, 0.2, 0.5], np.random.default_rng(0), 8) == Members((1,), 7)


def test_a_method_from_a_file_is_built_with_the_config(tmp_path: Path) -> None:
    f = tmp_path / "my_method.py"
    f.write_text(USER_METHOD)
    method = build_replay_method(_cfg(f"{f}:OneNewest"))
    assert isinstance(method, ExgrpoReplay) and type(method).__name__ == "OneNewest"
    cands = [Experience(np.array([i + 1], np.int32), np.zeros(1, np.float32), step=i) for i in range(3)]
    assert method.members(cands, [0.1, 0.2, 0.3], np.random.default_rng(0), 4) == Members((2,), 3)


@pytest.mark.parametrize(
    ("source", "spec", "said"),
    [
        (None, "nope", "invalid replay.method='nope': allowed one of exgrpo, prompt, prioritized"),
        (None, "{dir}/missing.py:X", "no such file"),
        ("def broken(:\n", "{file}:X", "importing it failed (SyntaxError"),
        ("raise RuntimeError('boom')\n", "{file}:X", "importing it failed (RuntimeError: boom)"),
        ("X = 1\n", "{file}:Y", "has no 'Y'"),
        ("X = 1\n", "{file}:X", "int is not callable"),
        (
            "class X:\n    def __init__(self, cfg):\n        raise ValueError('no')\n",
            "{file}:X",
            "building it failed",
        ),
        ("class X:\n    def __init__(self, cfg):\n        pass\n", "{file}:X", "it lacks expire, how_many"),
    ],
)
def test_a_missing_or_broken_method_is_refused_in_one_line(
    tmp_path: Path, source: str | None, spec: str, said: str
) -> None:
    f = tmp_path / "m.py"
    if source is not None:
        f.write_text(source)
    cfg = _cfg(spec.format(dir=tmp_path, file=f))
    with pytest.raises(ConfigError, match="^invalid replay.method=") as err:
        check_variants(cfg, "train")  # the start-up check, before any model loads
    assert said in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_the_cli_refuses_a_broken_method_before_the_run_starts(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("import no_such_module_anywhere\n")
    out = tmp_path / "run"
    res = run_cli(["train", f"hydra.run.dir={out}", f"replay.method={f}:X"])
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1].startswith(f"exgrpo train: invalid replay.method='{f}:X'")
    # refused like every bad value: Hydra's own files only (no checkpoint, nothing trained)
    assert "Traceback" not in res.stderr and not (out / "checkpoints").exists()
    assert not (out / "metrics.jsonl").exists()


@pytest.mark.long  # a 3-step training run (~10 s): make test-long
def test_a_users_method_from_a_file_trains(tmp_path: Path) -> None:
    """REPLAY_RUN replays floor(0.5 * 8) = 4 questions a step once the buffer holds them; the
    user's method replays one, and its rows reach the loss."""
    f = tmp_path / "my_method.py"
    f.write_text(USER_METHOD)
    out = tmp_path / "run"
    train_ok(out, *REPLAY_RUN, f"replay.method={f}:OneNewest")
    rows = metrics(out)
    replaying = [r for r in rows if r.get("replay/replayed_questions", 0) > 0]
    assert replaying, "the scenario must replay"
    assert all(r["replay/replayed_questions"] == 1 for r in replaying)
    # the importance weight's mean is over replayed tokens in the loss: NaN when none reached it
    assert all(math.isfinite(r["loss/importance_weight_mean"]) for r in replaying)
