"""evaluation/data_files.py, the benchmark files of a run made present before anything is read: a
file of the user's own folder is used with a warning whatever the run may fetch (eval.data_url
too); an offline run with an empty cache names every missing file in one message; and an empty
XDG_CACHE_HOME is the default cache for the eval's folder and the training's held-out file alike."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from exgrpo_cli.config.schema import EvalConfig, ExgrpoConfig
from exgrpo_cli.data import fetch
from exgrpo_cli.data.pinned import PINNED, PinnedFile, benchmark_cache_dir, resolve_data_dir
from exgrpo_cli.evaluation.benchmarks import BenchmarkDataError, load_suite
from exgrpo_cli.evaluation.data_files import pinned_val_file, prepare

from conftest import compose_train, loopback_mirror

BODY = bytes(range(256)) * 40
OURS = PinnedFile("ours.parquet", "x/ours.parquet", len(BODY), hashlib.sha256(BODY).hexdigest())
THEIRS = PinnedFile("theirs.parquet", "x/theirs.parquet", len(BODY), hashlib.sha256(BODY).hexdigest())


def _cfg(**eval_keys: object) -> ExgrpoConfig:
    return dataclasses.replace(ExgrpoConfig(), eval=EvalConfig(**eval_keys))  # type: ignore[arg-type]


def test_a_file_of_your_own_is_used_with_a_warning_even_with_a_mirror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    for pinned in (OURS, THEIRS):
        monkeypatch.setitem(PINNED, pinned.name, pinned)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / OURS.name).write_bytes(b"my own edit")
    with loopback_mirror({OURS.name: BODY, THEIRS.name: BODY}) as m:
        got = prepare(_cfg(data_dir=str(mine), data_url=m.url), [OURS.name, THEIRS.name])
        assert m.hits == {THEIRS.name: 1}  # only the file the folder lacks is fetched
    assert got == [mine / OURS.name, mine / THEIRS.name]
    assert (mine / OURS.name).read_bytes() == b"my own edit"  # used as it is, never replaced
    err = capsys.readouterr().err
    assert f"warning: {mine / OURS.name} is not the official {OURS.name}" in err


def test_the_cache_still_refuses_a_file_that_does_not_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setitem(PINNED, OURS.name, OURS)
    benchmark_cache_dir().mkdir(parents=True)
    (benchmark_cache_dir() / OURS.name).write_bytes(b"changed")
    with pytest.raises(fetch.FetchError, match="is not the official ours.parquet"):
        prepare(_cfg(), [OURS.name])


def test_offline_with_an_empty_cache_every_missing_file_is_named_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(fetch.urllib.request, "urlopen", lambda *a, **k: pytest.fail("network tried"))
    with pytest.raises(BenchmarkDataError) as err:
        load_suite(_cfg(suite="paper"))
    msg = str(err.value)
    assert "\n" not in msg and "HF_HUB_OFFLINE is set" in msg and str(benchmark_cache_dir()) in msg
    for name in ("test.id.parquet", "valid.arc_c.parquet", "valid.gpqa.parquet"):
        assert f"{name} from {PINNED[name].url}" in msg


def test_an_empty_xdg_cache_home_is_unset_for_eval_and_training_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    cache = tmp_path / ".cache" / "exgrpo" / "benchmarks"
    cfg = compose_train(["experiment=paper-qwen2.5-math-7b"])  # Hydra's oc.env: /exgrpo/benchmarks
    assert resolve_data_dir(cfg.eval.data_dir) == str(cache)
    assert cfg.data.val_path == str(cache / "valid.parquet")  # what the trainer reads
    assert pinned_val_file(cfg) is PINNED["valid.parquet"]  # so it is fetched at start
    # a config resolved that way but not typed through compose (a hand-built one) agrees too
    raw = dataclasses.replace(
        cfg,
        eval=dataclasses.replace(cfg.eval, data_dir="/exgrpo/benchmarks"),
        data=dataclasses.replace(cfg.data, val_path="/exgrpo/benchmarks/valid.parquet"),
    )
    assert pinned_val_file(raw) is PINNED["valid.parquet"]
