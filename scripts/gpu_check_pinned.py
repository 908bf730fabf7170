"""The GPU acceptance check's `pinned` section (#45 point 8): does
PYTORCH_CUDA_ALLOC_CONF=pinned_max_cached_size_mb:256 stop torch's caching host allocator from
rounding large pinned blocks up to a power of two?

The memory plan (exgrpo_cli/plan/host.py) counts every pinned block rounded up, as torch 2.13's
CachingHostAllocator reserves it: at 7B that is 64 GiB of HostAdamW moments for 56.7 GiB of state,
and 26.75 GiB of vLLM level-1 backups per rank for 14.2 GiB of weights. torch documents the option
for blocks above the given size (allocated at their exact size, returned to the driver when freed);
whether this torch on this machine does so is measured here, not assumed: two fresh processes, one
without and one with the option, each pin a block of the 7B's sizes and read the allocator's
counters (torch.cuda.host_memory_stats) before and after. The plan and the launcher keep the
rounding until a report of this section shows the option working.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from gpu_check_context import child_env

if TYPE_CHECKING:
    from gpu_check_context import Context

OPTION = "pinned_max_cached_size_mb:256"
# the 7B's pinned blocks in bf16 (vLLM's level-1 backups: a fused gate_up_proj, the embedding)
# and a block above 1 GiB, each allocated and freed in turn
SIZES = {
    "gate_up_proj (bf16)": 2 * 18944 * 3584 * 2,
    "embedding (bf16)": 152064 * 3584 * 2,
    "1.5 GiB": 3 << 29,
}

PROBE = r"""
import json, sys, torch
def held():
    stats = torch.cuda.host_memory_stats()
    return {k: int(v) for k, v in stats.items() if k.endswith("bytes.current")}
sizes = json.loads(sys.argv[1])
out = {}
for name, n in sizes.items():
    before = held()
    t = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    after = held()
    out[name] = {"requested": n, "deltas": {k: after[k] - before.get(k, 0) for k in after}}
    del t
print(json.dumps(out))
"""


def probe(conf: str | None) -> dict[str, Any]:
    """One fresh process (the allocator reads its options once, at start), with `conf` as
    PYTORCH_CUDA_ALLOC_CONF or without it: per size, the requested bytes and the counters' growth."""
    env = child_env()
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(SIZES)], env=env, capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        return {
            "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        }
    return {"sizes": json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr[-2000:]}


def block_bytes(entry: dict[str, Any]) -> int:
    """What the allocator took for one block: the largest growth of its byte counters."""
    return max(entry["deltas"].values(), default=0)


def evaluate(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """From the two probes: the block each size took, whether each run rounded any block up, and
    whether the option gave exact blocks for every size above its 256 MiB."""
    blocks = {name: {k: block_bytes(v) for k, v in run["sizes"].items()} for name, run in runs.items()}
    rounded = {name: any(b > SIZES[k] for k, b in got.items()) for name, got in blocks.items()}
    exact = all(blocks[OPTION][k] == n for k, n in SIZES.items() if n > 256 << 20)
    return {"block_bytes": blocks, "rounded": rounded, "option_gives_exact_blocks": exact}


def section_pinned(ctx: Context) -> None:
    import torch

    if ctx.dry or not torch.cuda.is_available():
        ctx.not_proven("pinned host memory needs CUDA (torch's caching host allocator)")
        return
    ctx.stage("probe without and with " + OPTION)
    runs = {"default": probe(None), OPTION: probe(OPTION)}
    ctx.record(pinned_option=OPTION, probes=runs, torch=torch.__version__)
    for name, run in runs.items():
        ctx.check(f"probe {name} ran", "error" not in run)
    if any("error" in run for run in runs.values()):
        return
    found = evaluate(runs)
    ctx.record(**found)
    print(f"pinned blocks, bytes: {json.dumps(found['block_bytes'])}", flush=True)
    print(f"{OPTION} exact above 256 MiB: {found['option_gives_exact_blocks']}", flush=True)
    ctx.check("the default rounds pinned blocks up (as the plan counts them)", found["rounded"]["default"])
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        ctx.record(note=f"this machine sets PYTORCH_CUDA_ALLOC_CONF={os.environ['PYTORCH_CUDA_ALLOC_CONF']}")
