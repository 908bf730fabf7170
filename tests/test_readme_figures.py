"""README's "Measured so far": every figure names the results it comes from, and each of those
results files or folders exists and records when it was measured, the commit, and the torch,
transformers and TRL versions (benchmarks/provenance.py, the suite's and default_run.py's own
"provenance" entry)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from conftest import REPO

RESULTS = re.compile(r"benchmarks/results/[\w.\-/]+")


def _bullets() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Measured so far", 1)[1].split("\n## ", 1)[0]
    bullets: list[str] = []
    for line in section.splitlines():
        if line.startswith("- "):
            bullets.append(line)
        elif bullets and line.startswith("  "):
            bullets[-1] += " " + line.strip()
    return bullets


def _record(path: Path) -> dict[str, Any]:
    """The provenance of a results folder or file: <folder>/provenance.json, the file's own
    "date" and "provenance" entries, or its <stem>.provenance.json beside it; a file inside a
    folder (a plot) has its folder's."""
    if path.is_dir():
        return json.loads((path / "provenance.json").read_text())
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "provenance" in data:
            return {"date": data.get("date"), **data["provenance"]}
    side = path.with_name(path.stem + ".provenance.json")
    if side.is_file():
        return json.loads(side.read_text())
    return json.loads((path.parent / "provenance.json").read_text())


def test_every_figure_names_results_that_record_date_commit_and_versions() -> None:
    bullets = _bullets()
    assert len(bullets) >= 4, bullets
    for bullet in bullets:
        names = RESULTS.findall(bullet)
        assert names, f"a figure without its results file: {bullet[:100]}"
        for name in names:
            path = REPO / name.rstrip("/.")
            assert path.exists(), f"{name} (README) does not exist"
            record = _record(path)
            assert isinstance(record.get("date"), str) and record["date"][:4] == "2026", (name, record)
            assert re.fullmatch(r"[0-9a-f]{40}", str(record.get("commit"))), (name, record)
            versions = record.get("versions") or {}
            for package in ("torch", "transformers", "trl"):
                assert isinstance(versions.get(package), str) and versions[package], (name, package)
