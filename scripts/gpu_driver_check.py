"""The last step of `make install-gpu` (scripts/install_gpu.sh): does this node's NVIDIA driver run
the CUDA build of torch that vLLM pinned?

vLLM 0.32/0.33 pin torch 2.13/2.14 built for CUDA 13, whose runtime needs a driver of 580 or newer
(CUDA's minor-version compatibility: 13.x needs >= 580, 12.x >= 525, 11.x >= 450). On an older
driver torch imports, `torch.cuda.is_available()` is False (with a warning), and the first CUDA
call of a training run fails far from the install. This check fails the install instead, with
one message naming the floor and what to do. A node without a visible GPU (a login node building
the venv) is reported, not failed: nothing there can be checked.

    python scripts/gpu_driver_check.py      # exit 0: usable (or no GPU here); 1: unusable
"""

from __future__ import annotations

import shutil
import subprocess
import sys

# the oldest driver that runs each CUDA major's runtime (minor-version compatibility, Linux)
DRIVER_FLOOR = {13: 580, 12: 525, 11: 450}


def driver_floor(cuda: str) -> int | None:
    """The oldest driver for torch's CUDA version ("13.0"), None when unknown."""
    try:
        return DRIVER_FLOOR.get(int(cuda.split(".")[0]))
    except ValueError:
        return None


def read_driver() -> tuple[str | None, int]:
    """(driver version, GPU count) from nvidia-smi; (None, 0) without it or without GPUs."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, 0
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, 0
    versions = [line.strip() for line in out.splitlines() if line.strip()]
    return (versions[0] if versions else None), len(versions)


def problem(driver: str | None, gpus: int, torch_version: str, cuda: str | None, usable: bool) -> str | None:
    """What makes this install unusable on this node, in one message; None when it is fine."""
    if not cuda:
        return (
            f"torch {torch_version} is not a CUDA build: the gpu extra needs vLLM's CUDA torch "
            "(reinstall with make install-gpu in a fresh venv)"
        )
    if gpus == 0:
        return None  # no GPU here: nothing to check (reported by the caller)
    floor = driver_floor(cuda)
    fixes = (
        f"update the NVIDIA driver to {floor} or newer, or train with rollout=hf on a torch built for "
        "a CUDA this driver runs (e.g. pip install torch --index-url https://download.pytorch.org/whl/cu126 "
        "in a venv without vllm)"
    )
    try:
        major = int(str(driver).split(".")[0])
    except ValueError:
        major = None
    if floor is not None and major is not None and major < floor:
        return (
            f"NVIDIA driver {driver} is older than the {floor} that torch {torch_version} (CUDA {cuda}) "
            f"needs: {fixes}"
        )
    if not usable:
        return (
            f"{gpus} GPU(s) visible (driver {driver}) but torch {torch_version} (CUDA {cuda}) cannot use "
            f"CUDA: {fixes}"
        )
    return None


def cuda_usable() -> bool:
    """A real CUDA call, not only is_available(): a tiny tensor made and read back."""
    import torch

    try:
        return bool(torch.cuda.is_available()) and float(torch.ones(1, device="cuda").sum()) == 1.0
    except Exception:  # noqa: BLE001 - any CUDA failure means unusable; the message says what to do
        return False


def main() -> int:
    import torch

    driver, gpus = read_driver()
    cuda = torch.version.cuda
    message = problem(driver, gpus, torch.__version__, cuda, cuda_usable() if gpus and cuda else False)
    if message:
        print(f"make install-gpu: {message}", file=sys.stderr)
        return 1
    if gpus == 0:
        print(
            f"no GPU visible here: torch {torch.__version__} (CUDA {cuda}) installed, its driver not checked"
        )
    else:
        print(f"{gpus} GPU(s), driver {driver} (>= {driver_floor(cuda or '')}), CUDA usable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
