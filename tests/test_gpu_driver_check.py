"""`make install-gpu` fails on a node whose NVIDIA driver cannot run vLLM's CUDA-13 torch, with one
message naming the driver floor and the two ways out (scripts/gpu_driver_check.py, the last step
of scripts/install_gpu.sh). nvidia-smi and torch are stubs: a script on PATH printing a driver
version, and a `torch` package on PYTHONPATH with the CUDA build and availability asked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "gpu_driver_check.py"


def run(
    tmp_path: Path, driver: str | None, cuda: str | None, available: bool, **extra: str
) -> subprocess.CompletedProcess:
    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    bin_dir.mkdir()
    (site / "torch").mkdir(parents=True)
    if driver is not None:  # one GPU per line, as nvidia-smi --query-gpu prints
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho {driver}\necho {driver}\n")
        smi.chmod(0o755)
    (site / "torch" / "__init__.py").write_text(
        "from types import SimpleNamespace\n"
        "__version__ = '2.13.0'\n"
        f"version = SimpleNamespace(cuda={cuda!r})\n"
        f"cuda = SimpleNamespace(is_available=lambda: {available})\n"
        "def ones(n, device=None):\n"
        "    return SimpleNamespace(sum=lambda: 1.0)\n"
    )
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", PYTHONPATH=str(site), LD_LIBRARY_PATH="")
    env["EXGRPO_CUDA_ROOTS"] = str(tmp_path / "no-cuda-here")  # this machine's /usr/local stays out
    env.update(extra)
    return subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def test_an_old_driver_fails_the_install_naming_the_floor_and_the_fixes(tmp_path: Path) -> None:
    res = run(tmp_path, "550.54.15", "13.0", available=False)
    assert res.returncode == 1
    assert "NVIDIA driver 550.54.15 is older than the 580 that torch 2.13.0 (CUDA 13.0) needs" in res.stderr
    assert "update the NVIDIA driver to 580 or newer" in res.stderr and "rollout=hf" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("driver", "cuda", "available", "rc", "says"),
    [
        (
            "580.95.05",
            "13.0",
            False,
            1,
            "2 GPU(s) visible (driver 580.95.05) but torch 2.13.0 (CUDA 13.0) cannot use",
        ),
        ("580.95.05", "13.0", True, 0, "2 GPU(s), driver 580.95.05 (>= 580), CUDA usable"),
        ("550.54.15", "12.6", True, 0, "driver 550.54.15 (>= 525)"),
        (None, "13.0", False, 0, "no GPU visible here"),
        ("580.95.05", None, False, 1, "is not a CUDA build"),
    ],
)
def test_what_the_check_says(
    tmp_path: Path, driver: str | None, cuda: str | None, available: bool, rc: int, says: str
) -> None:
    res = run(tmp_path, driver, cuda, available)
    assert res.returncode == rc, res.stdout + res.stderr
    assert says in res.stdout + res.stderr


def test_install_gpu_runs_the_check_before_it_reports_success() -> None:
    text = (REPO / "scripts" / "install_gpu.sh").read_text()
    assert text.index("scripts/gpu_driver_check.py") < text.index("ready in")


def test_an_old_driver_under_which_cuda_works_passes_with_one_warning(tmp_path: Path) -> None:
    """NVIDIA's forward-compatibility package: an older kernel driver, a newer libcuda, CUDA works."""
    res = run(tmp_path, "535.183.01", "13.0", available=True)
    assert res.returncode == 0, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "warning: NVIDIA driver 535.183.01 is older than the 580" in res.stderr
    assert "forward-compatibility package is in use" in res.stderr
    assert "driver 535.183.01 with forward compatibility, CUDA usable" in res.stdout


def test_an_installed_but_unused_compat_package_is_named(tmp_path: Path) -> None:
    compat = tmp_path / "cuda" / "cuda-13.0" / "compat"
    compat.mkdir(parents=True)
    (compat / "libcuda.so.580.65.06").write_text("")
    res = run(tmp_path, "535.183.01", "13.0", available=False, EXGRPO_CUDA_ROOTS=str(tmp_path / "cuda"))
    assert res.returncode == 1
    assert f"export LD_LIBRARY_PATH={compat}:$LD_LIBRARY_PATH" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_without_a_compat_package_the_failure_says_how_to_get_one(tmp_path: Path) -> None:
    res = run(tmp_path, "535.183.01", "13.0", available=False)
    assert (
        res.returncode == 1
        and "install NVIDIA's forward-compatibility package (cuda-compat-13-0" in res.stderr
    )


def test_the_check_can_be_turned_into_a_warning(tmp_path: Path) -> None:
    res = run(tmp_path, "535.183.01", "13.0", available=False, EXGRPO_DRIVER_CHECK="warn")
    assert res.returncode == 0
    assert res.stderr.startswith("make install-gpu: warning (EXGRPO_DRIVER_CHECK=warn): NVIDIA driver 535")
