"""`exgrpo eval trainer.nproc=2`: the ranks share each benchmark's questions (their own model
copies, the chunks' own seeds) and rank 0 writes the results one process writes (issue #12 point 9)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import run_cli

ARGS = ["trainer.threads=1", "eval.limit=24", "eval.batch_size=4", "logger.wandb.mode=disabled"]


def _without_times(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _without_times(v) for k, v in d.items() if k != "seconds"}
    if isinstance(d, list):
        return [_without_times(x) for x in d]
    return d


@pytest.mark.slow
@pytest.mark.long  # make test-all only (docs/testing.md)
def test_two_ranks_write_one_process_results(tiny_model: Path, tmp_path: Path) -> None:
    outs = {}
    for n in (1, 2):
        out = tmp_path / f"np{n}"
        res = run_cli(["eval", f"trainer.nproc={n}", f"hydra.run.dir={out}", *ARGS])
        assert res.returncode == 0, res.stderr[-3000:]
        outs[n] = out
    one, two = (json.loads((outs[n] / "results.json").read_text()) for n in (1, 2))
    assert _without_times(one) == _without_times(two)
    assert (outs[1] / "generations.jsonl").read_text() == (outs[2] / "generations.jsonl").read_text()
    rows = (outs[2] / "generations.jsonl").read_text().splitlines()
    assert len(rows) == 24 * 4  # every question's samples, written once (by rank 0)


@pytest.mark.slow
@pytest.mark.long  # make test-all only (docs/testing.md)
def test_eval_under_torchrun_is_one_eval_of_two_ranks(tiny_model: Path, tmp_path: Path) -> None:
    """torchrun starts the processes itself: they must form one eval, not run two whole ones into
    the same folder."""
    import subprocess
    import sys

    from conftest import REPO, cli_env

    single, launched = tmp_path / "one", tmp_path / "torchrun"
    assert run_cli(["eval", "trainer.nproc=1", f"hydra.run.dir={single}", *ARGS]).returncode == 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "exgrpo_cli", "eval", f"hydra.run.dir={launched}", *ARGS]  # fmt: skip
    res = subprocess.run(cmd, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    one, two = (json.loads((d / "results.json").read_text()) for d in (single, launched))
    assert _without_times(one) == _without_times(two)
    assert (single / "generations.jsonl").read_text() == (launched / "generations.jsonl").read_text()
    assert res.stderr.count("wrote ") == 1  # rank 0 alone reports


def test_several_models_with_vllm_on_several_ranks_are_refused_before_any_rank_starts(tmp_path: Path) -> None:
    res = run_cli(
        [
            "eval",
            "rollout=vllm",
            "trainer.nproc=2",
            "eval.compare=[builtin:tiny,builtin:tiny]",
            f"hydra.run.dir={tmp_path}",
            *ARGS,
        ]  # fmt: skip
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "eval.compare of 2 models with rollout.engine=vllm on 2 ranks" in res.stderr
    assert not (tmp_path / "generations.jsonl").exists()


def test_the_refusal_names_only_engines_that_need_it() -> None:
    from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig
    from exgrpo_cli.evaluation.runner import check_one_engine_per_rank

    cfg = ExgrpoConfig()
    cfg.eval.compare = ["a", "b"]
    check_one_engine_per_rank(cfg, 2)  # the HF engine: each model its own engine, nothing shared
    cfg.rollout.engine = "vllm"
    check_one_engine_per_rank(cfg, 1)  # one process: vLLM's own group, torn down and rebuilt
    with pytest.raises(ConfigError, match="run one `exgrpo eval` per model"):
        check_one_engine_per_rank(cfg, 2)
