"""A stand-in for SLURM's `scontrol` (absent on CI machines), for the requeue tests."""

from __future__ import annotations

from pathlib import Path


def stub_scontrol(folder: Path, exit_code: int = 0) -> Path:
    """An `scontrol` that records its arguments in <folder>/scontrol.calls and exits `exit_code`."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "scontrol"
    calls = folder / "scontrol.calls"
    exe.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\necho "stub refused" >&2\nexit {exit_code}\n')
    exe.chmod(0o755)
    return calls
