"""What a plan is computed for: the devices (planned or visible) and the run's settings.

Where it sits: between the typed config and `memory.plan_memory`. `planned_devices` reads
`trainer.plan_devices` (no torch, no CUDA: a plan for 8x80 GiB is computable on a laptop);
`visible_devices` asks torch about the GPUs this process will train on (only when CUDA is there)
or reads the host's memory; `inputs_from_config` turns the config into `PlanInputs`.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from exgrpo_cli.config.checks import parse_plan_devices
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.errors import UsageError
from exgrpo_cli.parallel.placement import OFFLOAD_MODES
from exgrpo_cli.plan.memory import AUTO_TOKEN_BUDGET, GiB, PlanInputs

WEIGHT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ATTENTION = {"flash_attention_2": "flash", "sdpa": "sdpa", "eager": "eager"}


@dataclass(frozen=True)
class Devices:
    count: int  # ranks, one device each
    bytes_each: int
    kind: str  # cuda | cpu
    label: str  # for the plan's header
    planned: bool = False  # from trainer.plan_devices rather than this machine
    per_node: int = 0  # ranks sharing a node's host memory (0: all)
    node_bytes: int = 0  # a node's host memory (0: unknown, not compared)


def planned_devices(value: str, per_node: int = 0, host_gib: float = 0.0) -> Devices:
    """`trainer.plan_devices` on nodes of `per_node` GPUs (0: min(count, 8)) with `host_gib` of
    host memory each (0: unknown)."""
    from exgrpo_cli.plan.host import NODE_GPUS

    count, gib_each = parse_plan_devices(value)
    per_node = min(per_node or NODE_GPUS, count)
    label = f"{count} x {gib_each:g} GiB GPUs"
    return Devices(count, int(gib_each * GiB), "cuda", label, True, per_node, int(host_gib * GiB))


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def uses_cuda(cfg: ExgrpoConfig) -> bool:
    """Whether this run trains on GPUs (trainer.device, or auto with CUDA visible)."""
    if cfg.trainer.device == "cpu":
        return False
    if cfg.trainer.device == "cuda":
        return True
    import torch

    return torch.cuda.is_available()


def visible_devices(cfg: ExgrpoConfig, launching: int = 0) -> Devices:
    """The devices this process's run trains on: its torchrun world (WORLD_SIZE ranks) of GPUs
    like the local one, or the host's memory shared by the ranks on it. Asks CUDA for the local
    GPU's size (after selecting it, as the trainer does, so no context lands on GPU 0).
    `launching`: the number of ranks this process is about to start (trainer.nproc); it then
    learns the GPUs' size without initialising CUDA itself (nvidia-smi, or a throwaway process)."""
    ranks = launching or max(_env_int("WORLD_SIZE", 1), 1)
    if uses_cuda(cfg):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(
                "invalid trainer.device=cuda: no CUDA device is visible (allowed here: auto or cpu)"
            )
        if launching:
            name, total = _gpu_without_context()
        else:
            visible = torch.cuda.device_count()
            local = _env_int("LOCAL_RANK", 0) % visible
            torch.cuda.set_device(local)
            props = torch.cuda.get_device_properties(local)
            name, total = props.name, int(props.total_memory)
        label = f"{ranks} x {name} ({total / GiB:.1f} GiB)"
        per_node = launching or max(_env_int("LOCAL_WORLD_SIZE", ranks), 1)
        node = int(cfg.trainer.plan_host_gib * GiB) or host_memory_bytes()
        return Devices(ranks, total, "cuda", label, per_node=per_node, node_bytes=node)
    local_ranks = launching or max(_env_int("LOCAL_WORLD_SIZE", ranks), 1)
    total = host_memory_bytes()
    label = f"host memory {total / GiB:.1f} GiB" + (
        f" shared by {local_ranks} ranks" if local_ranks > 1 else ""
    )
    return Devices(ranks, total // local_ranks, "cpu", label)


def _gpu_without_context() -> tuple[str, int]:
    """(name, bytes) of the first visible GPU, asked of nvidia-smi or of a throwaway process, so
    that the process that starts the ranks never holds a CUDA context (it would sit on GPU 0)."""
    import shutil
    import subprocess
    import sys

    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=30)
        lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        first = int(cvd.split(",")[0]) if cvd.split(",")[0].strip().isdigit() else 0
        if out.returncode == 0 and len(lines) > first:
            name, mib = lines[first].rsplit(",", 1)
            return name.strip(), int(float(mib)) * 2**20
    code = "import torch; p = torch.cuda.get_device_properties(0); print(p.total_memory); print(p.name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    total, name = out.stdout.strip().split("\n", 1)
    return name, int(total)


def attention_kind(cfg: ExgrpoConfig, devices: Devices) -> str:
    """The kernels `policy.model.attn_implementation` picks: auto is flash-attention-2 on CUDA
    when flash_attn is installed (assumed for planned GPUs: `exgrpo[gpu]` installs it), else sdpa."""
    chosen = cfg.model.attn_implementation
    if chosen != "auto":
        return ATTENTION[chosen]
    if devices.kind == "cuda" and (devices.planned or importlib.util.find_spec("flash_attn") is not None):
        return "flash"
    return "sdpa"


def inputs_from_config(cfg: ExgrpoConfig, devices: Devices) -> PlanInputs:
    from exgrpo_cli.config.registry import pick
    from exgrpo_cli.plan.engines import ENGINE_MEMORY

    m, r, a = cfg.model, cfg.rollout, cfg.algo
    engine = pick(ENGINE_MEMORY, "rollout.engine", r.engine)
    sleep = r.sleep_mode and devices.kind == "cuda"
    return PlanInputs(
        ranks=devices.count,
        device=devices.kind,
        device_bytes=devices.bytes_each,
        weight_bytes=WEIGHT_BYTES[m.dtype],
        mixed_bytes=2 if cfg.trainer.fsdp_mixed_precision else 0,
        offload=OFFLOAD_MODES[cfg.trainer.offload],
        checkpointing=m.gradient_checkpointing,
        token_budget=a.micro_batch_tokens or AUTO_TOKEN_BUDGET[devices.kind],
        seq_tokens=m.max_prompt_tokens + m.max_response_tokens,
        engine=engine,
        vllm_share=r.gpu_memory_utilization,
        vllm_sleep=sleep,
        vllm_cuda_graphs=r.enforce_eager is not True,
        vllm_max_len=m.max_prompt_tokens + max(m.max_response_tokens, cfg.eval.max_new_tokens),
        rollout_sequences=-(-a.questions_per_step * r.n // devices.count),
        attention=attention_kind(cfg, devices),
        ranks_per_node=devices.per_node,
        node_bytes=devices.node_bytes,
        level1_backups=sleep and not engine.needs_trainer_model and r.validation_sleep_level == 1,
        fp32_head=m.fp32_head,
        lora_rank=m.lora.rank,
        lora_targets=tuple(m.lora.target_modules),
        lora_sync=r.lora_sync,
    )
