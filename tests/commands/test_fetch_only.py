"""trainer.fetch_only / eval.fetch_only: everything a command will read lands in the caches (the
benchmark files from a loopback mirror; the hub's datasets and weights through stand-ins of
`datasets.load_dataset` and `huggingface_hub.snapshot_download` that keep the libraries' contract:
the real signature, and the real offline error when HF_HUB_OFFLINE is set), and no model loads."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from pathlib import Path
from typing import Any

import huggingface_hub
import pytest
from huggingface_hub.errors import LocalEntryNotFoundError

from exgrpo_cli.commands import eval as eval_cmd
from exgrpo_cli.commands import train as train_cmd
from exgrpo_cli.config.schema import EvalConfig, ExgrpoConfig
from exgrpo_cli.errors import UsageError

from conftest import SHARED_DATA, compose_train, loopback_mirror

BENCH = SHARED_DATA / "benchmarks"
REAL_SNAPSHOT = huggingface_hub.snapshot_download


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, list]:
    """The stand-ins; what they were asked for. No model may load."""
    asked: dict[str, list] = {"models": [], "datasets": []}

    def snapshot_download(*args: Any, **kwargs: Any) -> str:
        bound = inspect.signature(REAL_SNAPSHOT).bind(*args, **kwargs)  # TypeError as the library
        repo = bound.arguments["repo_id"]
        if huggingface_hub.constants.HF_HUB_OFFLINE or kwargs.get("local_files_only"):
            raise LocalEntryNotFoundError(
                "Cannot find an appropriate cached snapshot folder for the specified revision on the "
                "local disk and outgoing traffic has been disabled."
            )
        asked["models"].append(bound.arguments)
        return str(tmp_path / "hub" / repo.replace("/", "--"))

    def load_dataset(
        path: str, name: str | None = None, *, split: str | None = None, **kw: Any
    ) -> list[dict]:
        asked["datasets"].append((path, split))
        return [{"row": i} for i in range(3)]

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    from exgrpo_cli.policy import model

    monkeypatch.setattr(model, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    return asked


@pytest.fixture
def served() -> dict[str, bytes]:
    names = ("test.id.parquet", "valid.parquet", "valid.arc_c.parquet", "valid.gpqa.parquet")
    if not all((BENCH / n).is_file() for n in names):
        pytest.skip("../shared/data/benchmarks is absent")
    return {n: (BENCH / n).read_bytes() for n in names}


def test_eval_fetch_only_fills_every_cache(
    tmp_path: Path, hub: dict[str, list], served: dict[str, bytes], capsys: pytest.CaptureFixture[str]
):
    cfg = ExgrpoConfig()
    with loopback_mirror(served) as m:
        cfg = dataclasses.replace(
            cfg,
            model=dataclasses.replace(cfg.model, path="Elliott/Qwen2.5-Math-7B-16k-think"),
            eval=EvalConfig(suite="paper", data_dir=str(tmp_path / "bench"), data_url=m.url, fetch_only=True),
        )
        eval_cmd.run(cfg)
    assert sorted(p.name for p in (tmp_path / "bench").iterdir()) == [
        "test.id.parquet",
        "valid.arc_c.parquet",
        "valid.gpqa.parquet",
    ]
    assert hub["datasets"] == [("TIGER-Lab/MMLU-Pro", "test")]
    assert [a["repo_id"] for a in hub["models"]] == ["Elliott/Qwen2.5-Math-7B-16k-think"]
    assert hub["models"][0]["ignore_patterns"] == ["original/*"]
    out = capsys.readouterr().out
    assert "fetch-only: test.id.parquet:" in out and "MMLU-Pro: 3 rows of TIGER-Lab/MMLU-Pro" in out


def test_train_fetch_only_of_a_paper_recipe(
    tmp_path: Path, hub: dict[str, list], served: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with loopback_mirror(served) as m:
        cfg = compose_train(
            ["experiment=paper-qwen2.5-math-7b", f"eval.data_url={m.url}", "trainer.fetch_only=true"]
        )
        assert cfg.data.val_path == str(tmp_path / "cache" / "exgrpo" / "benchmarks" / "valid.parquet")
        train_cmd.run(cfg)
        assert m.hits == {"valid.parquet": 1}
    assert (tmp_path / "cache" / "exgrpo" / "benchmarks" / "valid.parquet").read_bytes() == served[
        "valid.parquet"
    ]
    assert hub["datasets"] == [("Elliott/Openr1-Math-46k-8192", "train")]
    assert [a["repo_id"] for a in hub["models"]] == ["Elliott/Qwen2.5-Math-7B-16k-think"]


def test_offline_fetch_only_is_one_line(
    tmp_path: Path, hub: dict[str, list], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = ExgrpoConfig()
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, path="meta-llama/Llama-3.1-8B"),
        eval=EvalConfig(suite="synthetic", benchmarks=["synthetic"], data_dir=str(tmp_path), fetch_only=True),
    )
    with pytest.raises(UsageError) as err:
        eval_cmd.run(cfg)
    msg = str(err.value)
    assert "\n" not in msg and "cannot fetch the model meta-llama/Llama-3.1-8B" in msg
    assert "LocalEntryNotFoundError" in msg


def test_a_training_dry_run_counts_the_cached_val_file_as_fetchable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cfg = compose_train(["experiment=paper-qwen2.5-math-7b"])
    assert not any("val_path" in p for p in train_cmd.data_problems(cfg))  # fetched at start
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert any("data.val_path" in p for p in train_cmd.data_problems(cfg))  # offline: it is not here
