"""replay.init_from (run/carry.py): a fresh run starts with another run's replay buffer, read as
data from a verified checkpoint, and refuses in one line one it cannot use.

The other run is the shared REPLAY_RUN (3 steps, a buffer of partly solved questions); tests that
change it work on a private copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from exgrpo_cli.checkpoint.files import COMPLETE, file_sha256
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.persistence import load_buffer
from exgrpo_cli.run import carry

from conftest import REPLAY_RUN, TINY, SharedRun, compose_train, metrics, run_cli, train_ok
from shared_artefacts import private_copy

# the new run: REPLAY_RUN's sizes (its group size and buckets), 2 steps
CARRY_RUN = [o for o in REPLAY_RUN if not o.startswith("trainer.steps=")] + ["trainer.steps=2"]


def _source_ckpt(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "step_3"


def _cfg(init_from: Path | str, *more: str) -> ExgrpoConfig:
    return compose_train([*CARRY_RUN, f"replay.init_from={init_from}", *more])


def _remanifest(ckpt: Path, name: str) -> None:
    """Record `name`'s new size and checksum in the manifest: a crafted checkpoint that verifies."""
    record = json.loads((ckpt / COMPLETE).read_text())
    path = ckpt / name
    record["files"][name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    (ckpt / COMPLETE).write_text(json.dumps(record))


# ----------------------------------------------------------------------------- carrying, in process


def _saved_buffer() -> dict:
    buf = ExperienceBuffer(4)
    ids, logp = np.array([5, 6, 7], np.int32), np.array([-0.1, -0.2, -0.3], np.float32)
    buf.observe_group("a", 2, [(ids, logp)], step=40, collect=True)
    buf.observe_group("b", 1, [(ids[:2], logp[:2])], step=41, collect=True)
    buf.observe_group("c", 3, [(ids[1:], logp[1:])], step=42, collect=True)
    buf.observe_group("done", 4, [], step=42, collect=True)
    buf.end_step()  # "done" retired in the old run
    return buf.state_dict()


def test_carried_entries_count_from_step_0_and_leave_the_retired_set_and_unknown_questions() -> None:
    new = carry.carried_buffer(_saved_buffer(), ExperienceBuffer(4))
    line = carry.start_buffer(carry.CarriedBuffer(Path("/old/step_42"), new), {"a", "c", "done", "other"})
    assert sorted(u for b in range(new.num_buckets) for u in new.questions_in_bucket(b)) == ["a", "c"]
    assert [e.step for u in ("a", "c") for e in new.experiences(u)] == [0, 0]  # not 40, 42
    assert new.retired == set() and "done" not in new
    assert new.experiences("a")[0].response_ids.tolist() == [5, 6, 7]
    assert np.allclose(new.experiences("a")[0].behavior_logp, [-0.1, -0.2, -0.3])  # the old behaviour
    assert "2 questions, 2 experiences" in line and "1 more questions are not in" in line


def test_a_buffer_none_of_whose_questions_the_data_has_is_refused() -> None:
    from exgrpo_cli.errors import UsageError
    from exgrpo_cli.run.setup import check_carried

    carried = carry.CarriedBuffer(
        Path("/old/step_42"), carry.carried_buffer(_saved_buffer(), ExperienceBuffer(4))
    )
    check_carried(carried, {"c"})  # one of three: started with it
    with pytest.raises(UsageError, match="none of its 3 buffered questions is in this run's training data"):
        check_carried(carried, {"x", "y"})


def test_the_saved_vocabulary_is_the_loaded_tokenizers(tmp_path: Path) -> None:
    """The old run's tokenizer.json read as data gives the vocabulary its loaded tokenizer has; a
    copy with two ids swapped does not."""
    from exgrpo_cli.config.schema import ModelConfig
    from exgrpo_cli.policy.model import load_tokenizer

    shutil.copytree(TINY, tmp_path / "model")
    loaded = load_tokenizer(ModelConfig(path=str(TINY))).get_vocab()
    assert carry.vocab_digest(carry.saved_vocab(tmp_path, "x")) == carry.vocab_digest(loaded)
    _swap_two_tokens(tmp_path / "model")
    assert carry.vocab_digest(carry.saved_vocab(tmp_path, "x")) != carry.vocab_digest(loaded)


def _swap_two_tokens(model_dir: Path) -> None:
    path = model_dir / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab = tok["model"]["vocab"]
    vocab["!"], vocab['"'] = vocab['"'], vocab["!"]
    path.write_text(json.dumps(tok))


# ----------------------------------------------------------------------------- refusals, in process


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("rollout.n=8", "groups of 4 responses, this run has rollout.n=8"),
        ("replay.bucket_by=reward_std", "bucketed by count, this run has replay.bucket_by=reward_std"),
        ("replay.bucket_edges=[0.5]", "replay.bucket_edges differ"),
    ],
)
def test_a_buffer_of_another_group_size_or_bucket_rule_is_refused(
    replay_run: SharedRun, override: str, says: str
):
    with pytest.raises(carry.InitFromRefused, match=says.replace("[", r"\[")) as err:
        carry.early_read(_cfg(replay_run.dir, override))
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


@pytest.mark.slow
def test_a_method_that_cannot_replay_the_buffer_is_refused(replay_run: SharedRun) -> None:
    """An ExGRPO buffer has no reward record: RePO's reward retrieval cannot start with it, its
    recency retrieval can (replay/methods.py `replays`)."""
    with pytest.raises(
        carry.InitFromRefused, match="replay.method=repo cannot start with its buffer: a stored"
    ):
        carry.early_read(_cfg(replay_run.dir, "replay.method=repo"))
    carried = carry.early_read(_cfg(replay_run.dir, "replay.method=repo", "replay.repo.strategy=recency"))
    assert carried is not None and carried.buffer.num_questions > 0


@pytest.mark.slow
def test_another_tokenizer_is_refused(replay_run: SharedRun, tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    shutil.copytree(TINY, model)
    _swap_two_tokens(model)
    with pytest.raises(carry.InitFromRefused, match="tokenizer's vocabulary differs"):
        carry.early_read(_cfg(replay_run.dir, f"model.path={model}"))
    assert carry.early_read(_cfg(replay_run.dir)) is not None  # the tiny model's own: accepted


@pytest.mark.slow
def test_a_corrupt_or_crafted_buffer_is_refused(replay_run: SharedRun, tmp_path: Path) -> None:
    run = private_copy(replay_run.dir, tmp_path / "run")
    ck = _source_ckpt(run)
    index = ck / "replay" / "index.json"
    state = json.loads(index.read_text())
    state["questions"].append("not-stored")  # arrays and index disagree
    index.write_text(json.dumps(state))
    with pytest.raises(carry.InitFromRefused, match="does not verify, nothing of it is read.*index.json"):
        carry.early_read(_cfg(ck))
    _remanifest(ck, "replay/index.json")  # now it verifies: the reader refuses what it holds
    with pytest.raises(carry.InitFromRefused, match="inconsistent buffer state"):
        carry.early_read(_cfg(ck))
    (ck / "replay" / "index.json").write_text("[1, 2")
    _remanifest(ck, "replay/index.json")
    with pytest.raises(carry.InitFromRefused, match="is not a readable buffer"):
        carry.early_read(_cfg(run))


@pytest.mark.slow
def test_a_run_dir_means_its_newest_verified_checkpoint_and_is_left_unchanged(
    replay_run: SharedRun, tmp_path: Path
):
    run = private_copy(replay_run.dir, tmp_path / "run")
    shutil.copytree(_source_ckpt(run), run / "checkpoints" / "step_2")  # an older good one
    arrays = _source_ckpt(run) / "replay" / "experiences.safetensors"
    data = arrays.read_bytes()
    arrays.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    carried = carry.early_read(_cfg(run))
    assert carried is not None and carried.checkpoint == run / "checkpoints" / "step_2"
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before  # nothing quarantined
    shutil.rmtree(run / "checkpoints" / "step_2")
    with pytest.raises(carry.InitFromRefused, match="no checkpoint of it verifies"):
        carry.early_read(_cfg(run))


# ----------------------------------------------------------------------------- the real path


@pytest.fixture(scope="module")
def carried_run(replay_run: SharedRun, tmp_path_factory: pytest.TempPathFactory) -> SharedRun:
    """2 steps of a fresh run started with REPLAY_RUN's buffer (read only: it is the shared run)."""
    out = tmp_path_factory.mktemp("carried") / "run"
    res = train_ok(out, *CARRY_RUN, f"replay.init_from={replay_run.dir}")
    return SharedRun(out, res.stdout + res.stderr, tuple(CARRY_RUN))


@pytest.mark.slow
def test_a_run_starts_with_the_carried_buffer(replay_run: SharedRun, carried_run: SharedRun) -> None:
    """Step 1 of the new run holds the carried questions and replays them: replayed rows reach the
    loss (loss/off_policy), aged 1 step (collected "at step 0" of this run)."""
    carried = load_buffer(str(_source_ckpt(replay_run.dir) / "replay"))["index"]["questions"]
    assert carried, "the source run stored nothing: the test would prove nothing"
    said = f"started with the buffer of {_source_ckpt(replay_run.dir)}: {len(carried)} questions"
    assert said in carried_run.console
    assert "replay: started at step 0 (a carried buffer (replay.init_from)" in carried_run.console
    first = metrics(carried_run.dir)[1]
    assert first["step"] == 1
    assert metrics(replay_run.dir)[1]["replay/replayed_questions"] == 0  # the same run, no buffer given
    # an empty buffer replays nothing at step 1: these rows are the carried questions'
    assert first["replay/buffer_questions"] > 0 and first["replay/replayed_questions"] > 0
    assert first["loss/off_policy"] != 0
    assert first["replay/age_max"] == 1


@pytest.mark.slow
@pytest.mark.long  # a third training run (~10-20 s on 2 busy cores): make test-long
def test_a_resume_keeps_its_own_buffer(carried_run: SharedRun, tmp_path: Path) -> None:
    """The resumed run reads its own checkpoint: replay.init_from, naming no folder now, is not read
    (it would be refused), and the step-2 buffer goes on."""
    out = private_copy(carried_run.dir, tmp_path / "run")
    more = [o for o in CARRY_RUN if not o.startswith("trainer.steps=")]
    res = train_ok(out, *more, "trainer.steps=3", f"replay.init_from={tmp_path / 'gone'}")
    assert "resumed from" in res.stdout + res.stderr and "started with the buffer" not in res.stderr
    rows = metrics(out)
    assert [m["step"] for m in rows] == [0, 1, 2, 3]
    assert rows[3]["replay/buffer_questions"] > 0


@pytest.mark.slow
def test_the_cli_refuses_in_one_line_before_the_run_dir_is_written(
    replay_run: SharedRun, tmp_path: Path
) -> None:
    out = tmp_path / "new"
    res = run_cli(
        ["train", f"hydra.run.dir={out}", *CARRY_RUN, "rollout.n=8", f"replay.init_from={replay_run.dir}"]
    )
    assert res.returncode == 2, res.stderr[-2000:]
    said = [line for line in res.stderr.splitlines() if line.strip()]
    assert said == [
        f"exgrpo train: replay.init_from={replay_run.dir}: its buffer holds groups of 4 responses, "
        "this run has rollout.n=8"
    ]
    assert {p.name for p in out.iterdir()} <= {".hydra", "train.log"}  # no metrics, lock or checkpoint
