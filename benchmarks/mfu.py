"""Benchmark 5: achieved FLOP/s of the train step's update against the device's peak (not a test).

    python benchmarks/mfu.py [--quick] [--models tiny smollm2-135m] [--repeats N]

The peak is measured in the same run: the best of several square matmuls (fp32 on a CPU, bf16 on
a GPU), so on a CPU "MFU" is the update's FLOP/s over what this machine's matmul reaches now. On a
GPU the script also reports MFU against the chip's datasheet dense bf16 peak.

The update is `policy_update` (forward, backward, clipping, AdamW step) on a batch shaped like a
training step's: the model preset's rows (questions x K), prompts of the task's length and
responses of mixed lengths. Its FLOPs count only real tokens (no padding): per token, a forward is
2 x the matmul parameters of the layers, plus 2 x hidden x vocabulary for response tokens (the
only positions projected onto the vocabulary), plus attention's 4 x layers x hidden x context;
forward + backward is 3 x that.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Stat, compose_config, model_overrides, smollm2_available, table  # noqa: E402

# datasheet dense bf16 TFLOP/s (no sparsity), by a substring of torch.cuda.get_device_name()
CHIP_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 70.0, "L4": 121.0}
# rows x prompt tokens x response length range per model (the suite's step sizes)
SHAPES = {"tiny": (128, 35, (12, 44)), "smollm2-135m": (8, 60, (16, 48))}


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, repeats: int = 5) -> float:
    """Best FLOP/s of an n x n matmul (after a warm-up)."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for i in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(4):
            (a @ b)
        _sync(device)
        if i:
            best = min(best, (time.perf_counter() - t0) / 4)
    return 2 * n**3 / best


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def update_flops(model: PreTrainedModel, prompt_lens: list[int], response_lens: list[int]) -> float:
    cfg = model.config
    d, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    layer_params = sum(
        p.numel() for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2
    )  # the layers' matmul weights
    flops = 0.0
    for p, r in zip(prompt_lens, response_lens):
        seq = p + r
        flops += 2 * layer_params * seq + 2 * d * vocab * r
        flops += 4 * layers * d * seq * (seq + 1) / 2  # QK^T and AV over the causal context
    return 3 * flops


def measure(model_name: str, repeats: int, device: torch.device) -> dict[str, Any]:
    import numpy as np
    import torch

    from exgrpo_cli.algo.advantages import group_advantages
    from exgrpo_cli.algo.aggregation import drgrpo
    from exgrpo_cli.algo.losses import ExgrpoLoss
    from exgrpo_cli.data.types import Question
    from exgrpo_cli.policy.forward import token_budget
    from exgrpo_cli.policy.model import load_model
    from exgrpo_cli.replay.mixing import Group, Response, build_mixed_batch
    from exgrpo_cli.step.update import UpdatePlan, policy_update

    cfg = compose_config([*model_overrides(model_name), "trainer.output_dir=/tmp/exgrpo-bench-mfu"])
    if device.type == "cuda":
        cfg.model.dtype = "bfloat16"
    model = load_model(cfg.model, device)
    rows, plen, (lo, hi) = SHAPES[model_name]
    rng = np.random.default_rng(0)
    V = model.config.vocab_size
    groups = []
    for g in range(rows // cfg.rollout.n):
        prompt = rng.integers(3, V, plen).tolist()
        resp = [
            Response(
                rng.integers(3, V, int(rng.integers(lo, hi + 1))).tolist(),
                None,
                reward=float(rng.random() < 0.4),
            )
            for _ in range(cfg.rollout.n)
        ]
        groups.append(Group(Question(f"q{g}", "", ""), prompt, resp))
    batch = build_mixed_batch(groups)
    adv = group_advantages(batch.rewards, batch.group_index)
    a = cfg.algo
    settings = UpdatePlan(
        loss=ExgrpoLoss(clip_eps=a.clip_eps, beta=None),
        aggregation=drgrpo,
        importance_correction=True,
        entropy_coef=a.entropy_coef,
        max_response_tokens=hi,
        updates=1,
        micro_batch_tokens=token_budget(a.micro_batch_tokens, device),
        grad_clip=a.grad_clip,
        skip_grad_norm_above=float("inf"),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-9)  # a real step that leaves the model usable
    times = []
    for i in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        policy_update(model, opt, batch, adv, settings, pad_id=0)
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    flops = update_flops(model, [len(p) for p in batch.prompt_ids], [len(r) for r in batch.response_ids])
    return {
        "model": model_name,
        "rows": len(batch),
        "tokens": sum(len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)),
        "params": sum(p.numel() for p in model.parameters()),
        "update_s": Stat(times).as_json(),
        "flops": flops,
        "flops_per_s": Stat([flops / t for t in times]).as_json(),
    }


def run(quick: bool, models: list[str] | None = None, repeats: int | None = None, threads: int = 0) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    models = models or (["tiny"] if quick or not smollm2_available() else ["tiny", "smollm2-135m"])
    repeats = repeats or (3 if quick else 5)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "dtype": str(dtype).replace("torch.", ""),
    }
    peaks = [matmul_peak(device, dtype, n) for n in ((4096, 8192) if device.type == "cuda" else (512, 1024))]
    out["matmul_peak_flops"] = max(peaks)
    chip = next((v for k, v in CHIP_PEAK_TFLOPS.items() if k in out["device"]), None)
    out["chip_peak_flops"] = chip * 1e12 if chip else None
    out["models"] = []
    for m in models:
        r = measure(m, repeats, device)
        r["mfu_vs_matmul"] = r["flops_per_s"]["median"] / out["matmul_peak_flops"]
        if out["chip_peak_flops"]:
            r["mfu_vs_chip"] = r["flops_per_s"]["median"] / out["chip_peak_flops"]
        out["models"].append(r)
    return out


def render(res: dict) -> str:
    rows = []
    for r in res["models"]:
        name = f"{r['model']} ({r['params'] / 1e6:.2f}M params), {r['rows']} rows / {r['tokens']} tokens"
        rows.append(
            [
                name,
                Stat(r["update_s"]["values"]).fmt(".3g"),
                f"{r['flops_per_s']['median'] / 1e9:.1f}",
                f"{r['mfu_vs_matmul']:.1%}",
                f"{r['mfu_vs_chip']:.2%}" if "mfu_vs_chip" in r else "-",
            ]
        )
    head = (
        f"update on {res['device']} ({res['dtype']}, {res['threads']} threads; "
        f"matmul peak {res['matmul_peak_flops'] / 1e9:.1f} GFLOP/s)"
    )
    return table([head, "s/update", "GFLOP/s", "MFU vs matmul", "MFU vs chip"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--models", nargs="*")
    p.add_argument("--repeats", type=int)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    a = p.parse_args()
    res = run(a.quick, a.models, a.repeats, a.threads)
    print(render(res), file=sys.stderr)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
