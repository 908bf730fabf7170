"""Provenance of a results file or folder under benchmarks/results/ (not a test).

    python benchmarks/provenance.py benchmarks/results/<folder>          # writes <folder>/provenance.json
    python benchmarks/provenance.py benchmarks/results/<file>.json       # writes <file>.provenance.json

Records what a figure the docs quote needs to be traced: when it was measured, the commit
measured (and whether the tree had changes on top), the torch, transformers and TRL versions
(`common.provenance`: read from .venv and .venv-bench now) and the load average. Run it right
after the measurement, on the same checkout. The suite (`make bench`) and
benchmarks/default_run.py record the same inside their own results files.
`sidecar(path)` is where the record of `path` lives; tests/test_readme_figures.py reads it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from pathlib import Path

from common import provenance


def sidecar(path: Path) -> Path:
    """Where the provenance record of a results folder or file lives."""
    return path / "provenance.json" if path.is_dir() else path.with_name(path.stem + ".provenance.json")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", type=Path, help="a results folder or file under benchmarks/results/")
    p.add_argument("--command", default="", help="the command that measured it")
    p.add_argument("--date", default="", help="when it was measured (default: now)")
    a = p.parse_args()
    if not a.path.exists():
        raise SystemExit(f"no such results file or folder: {a.path}")
    record = {
        "date": a.date or dt.datetime.now().isoformat(timespec="seconds"),
        **provenance(),
        "loadavg": os.getloadavg()[0],
        "command": a.command,
    }
    out = sidecar(a.path)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
