"""Data you can find: every missing benchmark file is named in one message before anything is read
or loaded, and a training dry run checks its data on this machine (only a warning when it plans
another with trainer.plan_devices)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from exgrpo_cli.commands.train import check_data_here, data_problems
from exgrpo_cli.config.schema import EvalConfig, ExgrpoConfig
from exgrpo_cli.errors import UsageError
from exgrpo_cli.evaluation import benchmarks as B

from conftest import REPO, run_cli

PAPER = list(B.SUITES["paper"])
HAS_DATASETS = importlib.util.find_spec("datasets") is not None


def _eval_cfg(data_dir: str) -> ExgrpoConfig:
    return ExgrpoConfig(eval=EvalConfig(suite="paper", benchmarks=PAPER, data_dir=data_dir))


def test_every_missing_file_is_named_at_once(tmp_path: Path):
    (tmp_path / "valid.gpqa.parquet").write_bytes(b"")  # one file present: not named
    with pytest.raises(B.BenchmarkDataError) as err:
        B.check_data(_eval_cfg(str(tmp_path)))
    msg = str(err.value)
    assert "\n" not in msg and B.DATA_DOC in msg
    for name in ("test.id.parquet (AIME24 rows data_source=aime, AIME25 rows", "valid.arc_c.parquet (ARC-c)"):
        assert name in msg
    assert "valid.gpqa.parquet" not in msg
    assert ("valid.mmlu_pro.parquet" in msg) != HAS_DATASETS  # with datasets: the hub copy is tried


def test_the_docs_say_where_each_file_comes_from():
    page = (REPO / "docs" / "evaluation.md").read_text()
    section = page[page.index("## Benchmark data") :]
    for b in B.PAPER_BENCHMARKS:
        assert b.file in section and b.title in section
    assert "valid.parquet" in section and "TIGER-Lab/MMLU-Pro" in section


@pytest.mark.slow  # the CLI (~10 s under load)
def test_eval_refuses_before_any_model_loads_and_leaves_no_folder(tmp_path: Path):
    res = run_cli(["eval", "eval=paper", f"eval.data_dir={tmp_path / 'nope'}"], cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "test.id.parquet" in res.stderr and "valid.arc_c.parquet" in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_checks_the_data_here_and_warns_for_another_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    cfg = ExgrpoConfig()
    cfg = dataclasses.replace(
        cfg,
        data=dataclasses.replace(cfg.data, val_path=str(tmp_path / "valid.parquet")),
        eval=dataclasses.replace(cfg.eval, data_dir=str(tmp_path / "bench")),
    )
    problems = data_problems(cfg)
    assert len(problems) == 2 and "data.val_path" in problems[0] and "eval.data_dir" in problems[1]
    with pytest.raises(UsageError, match="no such file"):
        check_data_here(cfg)
    planned = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, plan_devices="8x80"))
    check_data_here(planned)  # another machine's files: a warning only
    assert capsys.readouterr().out.startswith("warning: not on this machine: data.val_path=")
    (tmp_path / "valid.parquet").write_bytes(b"")
    (tmp_path / "bench").mkdir()
    assert data_problems(cfg) == []
