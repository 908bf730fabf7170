"""The GPU acceptance check's choice of what to run: a model shape and an offload mode that fit the
device and the host memory of the machine it runs on, from exgrpo's memory plan.

Where it sits: the update and generate sections (gpu_check_sections.py) call `choose_run` before
they build anything. The shape is Qwen2.5-Math-7B's (the `model.arch` numbers of
conf/model/qwen2.5-math-7b.yaml) with as many of its 28 decoder layers as fit: every width, the
vocabulary, the head and the per-layer terms of the plan stay those of the 7B, only their count
changes. For each layer count, most first, the offload modes are tried least offloaded first
(none, optimizer, all); the first whose device plan fits (every phase within 90% of the GPU) and
whose host memory fits (`host_need`: the offloaded state as torch pins it, plan/host.py, plus the
process, within 90% of the host's available memory) is run. `MACHINES` are the two kinds of lent
machine; the dry run plans both and checks that each gets a configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpu_check_context import PRESET_7B, Sizes, host_memory_bytes

if TYPE_CHECKING:
    from transformers import Qwen2Config

    from exgrpo_cli.plan.arch import Arch
    from exgrpo_cli.plan.memory import Plan, PlanInputs

GiB = 2**30
HOST_SHARE = 0.9  # of the host's available memory: the rest for the page cache and the OS
DRY_HOST_GIB = 128.0  # a dry run's host without --host-gib: the lent machines'
LAYER_COUNTS = (28, 24, 20, 16, 12, 8, 4, 2)  # the 7B's decoder layers, then fewer
# the lent machines (torch's total_memory of the GPU, the host's memory), both planned by the dry run
MACHINES = {"H100 80GB": (79.1, 128.0), "H200 141GB": (139.8, 128.0)}
PRESET_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "tie_word_embeddings",
    "max_position_embeddings",
)


def update_config(sizes: Sizes, layers: int = 0) -> Qwen2Config:
    """The update's Qwen2: Qwen2.5-Math-7B's numbers from its preset (with `layers` decoder layers
    when given), or the dry run's toy."""
    from transformers import Qwen2Config

    numbers = dict(sizes.arch)
    if not numbers:
        import yaml

        a = yaml.safe_load(PRESET_7B.read_text())["arch"]
        numbers = {k: a[k] for k in PRESET_KEYS}
        if layers:
            numbers["num_hidden_layers"] = layers
    return Qwen2Config(**numbers, use_cache=False)


def plan_arch(hf_config: Qwen2Config, source: str) -> Arch:
    from exgrpo_cli.plan.arch import arch_from_config_json

    return arch_from_config_json(hf_config.to_dict(), source)


def attention_kind(impl: str) -> str:
    from exgrpo_cli.plan.inputs import ATTENTION

    return ATTENTION.get(impl, "sdpa")


def plan_inputs(device: str, device_bytes: int, sizes: Sizes, attention: str) -> PlanInputs:
    """The plan's inputs for the update of `sizes` on one device: fp32 master weights, bf16
    compute under FSDP2 (on CUDA), gradient checkpointing, the HF engine, no replay scoring. The
    host side is checked by `host_need` (no checkpoint is read: the model is built in place)."""
    from exgrpo_cli.parallel.placement import OFFLOAD_MODES
    from exgrpo_cli.plan.engines import ENGINE_MEMORY
    from exgrpo_cli.plan.memory import AUTO_TOKEN_BUDGET, PlanInputs

    seq = sizes.prompt_tokens + sizes.response_tokens
    return PlanInputs(
        ranks=1,
        device=device,
        device_bytes=device_bytes,
        weight_bytes=4,
        mixed_bytes=2,
        offload=OFFLOAD_MODES["none"],
        checkpointing=True,
        token_budget=sizes.micro_batch_tokens or AUTO_TOKEN_BUDGET[device],
        seq_tokens=seq,
        engine=ENGINE_MEMORY["hf"],
        vllm_share=0.0,
        vllm_sleep=False,
        vllm_max_len=seq,
        rollout_sequences=sizes.rows,
        attention=attention,
    )


def host_need(arch: Arch, offload: str) -> int:
    """Host memory the update needs in `offload` mode: the offloaded state as torch allocates it
    (pinned blocks rounded up to powers of two) and the process itself (plan/host.py)."""
    from exgrpo_cli.parallel.placement import OFFLOAD_MODES
    from exgrpo_cli.plan.host import PROCESS_BYTES, offload_terms

    return sum(t.per_rank for t in offload_terms(arch, 1, 4, OFFLOAD_MODES[offload])) + PROCESS_BYTES


@dataclass(frozen=True)
class Choice:
    layers: int
    offload: str
    plan: Plan  # the device plan of this shape and mode
    host_bytes: int  # what it needs of the host
    host_limit: int  # HOST_SHARE of the host's available memory

    @property
    def fits(self) -> bool:
        return self.plan.fits and self.host_bytes <= self.host_limit

    def record(self) -> dict[str, Any]:
        phase, peak = self.plan.peak
        return {
            "layers": self.layers,
            "params": self.plan.arch.params,
            "offload": self.offload,
            "fits": self.fits,
            "device_peak_phase": phase,
            "device_peak_bytes": peak,
            "device_limit_bytes": self.plan.inputs.limit,
            "host_bytes": self.host_bytes,
            "host_limit_bytes": self.host_limit,
        }

    def line(self) -> str:
        phase, peak = self.plan.peak
        limit = self.plan.inputs.limit
        return (
            f"Qwen2.5-Math-7B's shape with {self.layers} of 28 layers ({self.plan.arch.params / 1e9:.2f}B), "
            f"offload={self.offload}: device {phase} {peak / GiB:.1f} of {limit / GiB:.1f} GiB, "
            f"host {self.host_bytes / GiB:.1f} of {self.host_limit / GiB:.1f} GiB"
        )


def choose_run(device_bytes: int, host_bytes: int, attention: str, forced: str = "auto") -> Choice:
    """The most layers, then the least offload, that fit the device and the host (`forced`: only
    that offload mode); when nothing fits, the last tried (its `fits` says so). `attention`: the
    kernels the update runs (flash with flash_attn installed, else sdpa)."""
    from gpu_check_context import GPU

    from exgrpo_cli.parallel.placement import OFFLOAD_MODES
    from exgrpo_cli.plan.memory import plan_memory

    modes = tuple(OFFLOAD_MODES) if forced == "auto" else (forced,)
    x = plan_inputs("cuda", device_bytes, GPU, attention)
    limit = int(HOST_SHARE * host_bytes)
    choice = None
    for n in LAYER_COUNTS:
        arch = plan_arch(update_config(GPU, n), f"{PRESET_7B.name} model.arch, {n} layers")
        for mode in modes:
            plan = plan_memory(arch, replace(x, offload=OFFLOAD_MODES[mode]))
            choice = Choice(n, mode, plan, host_need(arch, mode), limit)
            if choice.fits:
                return choice
    assert choice is not None
    return choice


def machines() -> dict[str, Choice]:
    """The choice on each kind of lent machine (their GPU and host sizes, not this machine's;
    sdpa attention: the lent machines have no flash_attn)."""
    return {
        name: choose_run(int(dev * GiB), int(host * GiB), "sdpa") for name, (dev, host) in MACHINES.items()
    }


def available_host_bytes() -> int:
    from exgrpo_cli.host import MEMINFO, proc_bytes

    return proc_bytes(MEMINFO, "MemAvailable") or host_memory_bytes()


def update_phases_bytes(plan: Plan) -> int:
    """The plan's largest update phase (backward, its end, the optimizer step), less what torch's
    allocator does not count (the CUDA context)."""
    from exgrpo_cli.plan.memory import BACKWARD, BWD_END, STEP

    return phase_bytes(plan, (BACKWARD, BWD_END, STEP))


def phase_bytes(plan: Plan, phases: tuple[int, ...]) -> int:
    """The plan's largest of `phases`, less what torch's allocator does not see: the CUDA context,
    and the rollout engine's share (vLLM allocates outside torch's allocator; no engine runs in
    the update section)."""
    kept = [t for t in plan.terms if not t.name.startswith(("CUDA", "vLLM", "weight sync", "HF "))]
    return max(sum(t.bytes[p] for t in kept) for p in phases)


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
        "offload": plan.inputs.offload.name,
        "attention": plan.inputs.attention,
    }
