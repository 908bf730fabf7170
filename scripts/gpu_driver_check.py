"""The last step of `make install-gpu` (scripts/install_gpu.sh): does this node's NVIDIA driver run
the CUDA build of torch that vLLM pinned?

vLLM 0.32/0.33 pin torch 2.13/2.14 built for CUDA 13, whose runtime needs a driver of 580 or newer
(CUDA's minor-version compatibility: 13.x needs >= 580, 12.x >= 525, 11.x >= 450). On an older
driver torch imports, `torch.cuda.is_available()` is False (with a warning), and the first CUDA
call of a training run fails far from the install. This check fails the install instead, with
one message naming the floor and what to do. A node without a visible GPU (a login node building
the venv) is reported, not failed: nothing there can be checked.

An older driver is not always the end: NVIDIA's CUDA forward-compatibility package
(`cuda-compat-13-0`, datacenter GPUs on a supported driver branch) puts a newer user-mode driver
(libcuda.so) in /usr/local/cuda-13.0/compat, used when that folder is on LD_LIBRARY_PATH. So the
floor decides only when CUDA does not work: an old driver under which a real CUDA call succeeds
passes with one warning (naming the compat libcuda it loaded, when it can see it); one under which
it fails says where a compat package lies, if one is installed, and how to use it.
EXGRPO_DRIVER_CHECK=warn turns a failure into that one warning (exit 0), for a node where the
check is wrong.

    python scripts/gpu_driver_check.py      # exit 0: usable (or no GPU here); 1: unusable
"""

from __future__ import annotations

import glob
import os
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


def compat_dirs(cuda: str) -> list[str]:
    """Folders of NVIDIA's forward-compatibility package for CUDA `cuda` ("13.0") installed here:
    <root>/cuda-<major>*/compat holding a libcuda.so (roots: EXGRPO_CUDA_ROOTS, default /usr/local)."""
    major = cuda.split(".")[0]
    roots = os.environ.get("EXGRPO_CUDA_ROOTS", "/usr/local").split(os.pathsep)
    found = []
    for root in roots:
        for folder in sorted(glob.glob(os.path.join(root, f"cuda-{major}*", "compat"))):
            if glob.glob(os.path.join(folder, "libcuda.so*")):
                found.append(folder)
    return found


def loaded_libcuda() -> str | None:
    """The libcuda this process mapped (after a CUDA call), from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcuda.so" in line}
    except OSError:
        return None
    return sorted(paths)[0] if paths else None


def _on_library_path(folder: str) -> bool:
    wanted = os.path.realpath(folder)
    return any(os.path.realpath(p) == wanted for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p)


def forward_compat_notice(driver: str | None, cuda: str, loaded: str | None) -> str:
    """The one warning for an old driver under which CUDA works."""
    via = f" (libcuda: {loaded})" if loaded else ""
    return (
        f"warning: NVIDIA driver {driver} is older than the {driver_floor(cuda)} that CUDA {cuda} needs, "
        f"but a CUDA call works: NVIDIA's forward-compatibility package is in use{via}; keep it on "
        "LD_LIBRARY_PATH for every run on this node"
    )


def problem(driver: str | None, gpus: int, torch_version: str, cuda: str | None, usable: bool) -> str | None:
    """What makes this install unusable on this node, in one message; None when it is fine (an old
    driver under which CUDA works: forward compatibility, warned about by the caller)."""
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
    major = _major(driver)
    if floor is not None and major is not None and major < floor and not usable:
        compat = [d for d in compat_dirs(cuda) if not _on_library_path(d)]
        if compat:
            fixes = (
                f"NVIDIA's forward-compatibility package is installed but not in use: "
                f"export LD_LIBRARY_PATH={compat[0]}:$LD_LIBRARY_PATH and run this check again; or {fixes}"
            )
        else:
            package = "cuda-compat-" + "-".join((cuda.split(".") + ["0"])[:2])
            fixes += (
                f"; or install NVIDIA's forward-compatibility package ({package}, datacenter GPUs) "
                "and put its compat folder on LD_LIBRARY_PATH"
            )
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
    usable = cuda_usable() if gpus and cuda else False
    message = problem(driver, gpus, torch.__version__, cuda, usable)
    if message:
        if os.environ.get("EXGRPO_DRIVER_CHECK") == "warn":
            print(f"make install-gpu: warning (EXGRPO_DRIVER_CHECK=warn): {message}", file=sys.stderr)
            return 0
        print(f"make install-gpu: {message}", file=sys.stderr)
        return 1
    if gpus == 0:
        print(
            f"no GPU visible here: torch {torch.__version__} (CUDA {cuda}) installed, its driver not checked"
        )
        return 0
    floor = driver_floor(cuda or "")
    if floor is not None and _major(driver) is not None and (_major(driver) or 0) < floor:
        print(
            f"make install-gpu: {forward_compat_notice(driver, cuda or '', loaded_libcuda())}",
            file=sys.stderr,
        )
        print(f"{gpus} GPU(s), driver {driver} with forward compatibility, CUDA usable")
        return 0
    print(f"{gpus} GPU(s), driver {driver} (>= {floor}), CUDA usable")
    return 0


def _major(driver: str | None) -> int | None:
    try:
        return int(str(driver).split(".")[0])
    except ValueError:
        return None


if __name__ == "__main__":
    sys.exit(main())
