"""A newcomer's first training run: a few lines on the terminal (W&B offline says one), and every
metric it logs is explained in docs/metrics.md."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from conftest import REPO, SMALL_RUN, cli_env, metrics, run_captured


def documented_metrics() -> list[re.Pattern[str]]:
    """The keys of docs/metrics.md's table, `<i>` / `<n>` standing for a number."""
    keys = re.findall(r"^\| `([^`]+)` \|", (REPO / "docs" / "metrics.md").read_text(), flags=re.M)
    return [re.compile(re.escape(k).replace("<i>", r"\d+").replace("<n>", r"\d+") + "$") for k in keys]


def test_the_metrics_page_lists_patterns():
    pats = documented_metrics()
    assert len(pats) > 40 and any(p.match("replay/bucket/3") for p in pats)
    assert not any(p.match("replay/bucket/x") for p in pats)


@pytest.mark.slow
def test_a_short_run_is_quiet_and_logs_only_documented_metrics(tmp_path: Path):
    drop = ("WANDB_MODE", "WANDB_SILENT", "WANDB_QUIET")  # W&B as a newcomer's machine has it
    env = {k: v for k, v in cli_env().items() if k not in drop}
    overrides = [o for o in SMALL_RUN if not o.startswith("logger.wandb.mode=")]
    res = run_captured(
        [sys.executable, "-m", "exgrpo_cli", "train", *overrides, "trainer.steps=3"]
        + ["replay.start_threshold=0", "logger.wandb.mode=offline", f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
        env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    printed = (res.stdout + res.stderr).splitlines()
    assert len(printed) <= 15, "\n".join(printed)
    assert sum("wandb sync" in line for line in printed) == 1  # W&B offline: one line, how to sync
    rows = metrics(tmp_path / "run")
    logged = {k for row in rows for k in row}
    assert "replay/replayed_questions" in logged and any(r.get("replay/active") for r in rows)
    pats = documented_metrics()
    undocumented = sorted(k for k in logged if not any(p.match(k) for p in pats))
    assert undocumented == [], f"logged but not in docs/metrics.md: {undocumented}"
