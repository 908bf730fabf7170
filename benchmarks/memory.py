"""Benchmark 6: the update's memory per response token at Qwen2.5's vocabulary, and what the
chunked log-prob head costs in time on the default run (not a test).

    python benchmarks/memory.py [--quick] [--threads N] [--repeats N]

Memory. The update (`policy_update`: forward, the loss with the entropy bonus, backward, clipping,
AdamW's step) of one row of 16 prompt + N response tokens, on a tiny Qwen2 body (hidden 64, one
layer, random weights, fp32, untied head) with Qwen2.5's 152,064-token vocabulary, so that the
[tokens x vocabulary] logits dominate. Two paths:
  chunked  exgrpo's forward as it is: the final hidden states projected `chunk_tokens` rows at a
           time, recomputed in backward (policy/forward.py, algo.chunked_token_logprobs)
  full     the old forward, forced: `output_head` reports no plain head, so `forward_logprobs`
           takes `response_logits` + algo.token_logprobs / token_entropy on the full logits
Each (path, N) runs in a fresh process (N = 512 and 2,048): a warm-up update of a 16-token
response creates AdamW's state and the one-time allocations, then the kernel's peak-RSS mark is
reset (/proc/self/clear_refs) and the measured update runs; its peak is VmHWM minus the RSS just
before it. glibc's malloc is told to map every block of 64 KiB or more on its own
(MALLOC_MMAP_THRESHOLD_), so freed memory leaves the RSS and the mark follows what is live.
The growth per added response token is given in fp32 [tokens x vocabulary] tensors:
(peak(2048) - peak(512)) / (1536 x 152,064 x 4 bytes); the issue's target for the chunked path
is <= 0.25 (the full-logits path: ~6).

Speed. The default run (`exgrpo train` with no overrides: the tiny model, 16 questions x K=8)
builds its trainer, samples and grades step 1's rollouts once, and then times `policy_update` on
that same batch with the trainer's own update plan, the two paths alternating (chunked, full,
full, chunked, ...) after one warm-up each; reported: each side's median s/update with min..max,
and the paired ratio chunked / full (target: <= 1.05).

Worker mode (what the orchestrator runs, one process per measurement):
    python benchmarks/memory.py --worker chunked|full --tokens N
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from exgrpo_cli.replay.mixing import MixedBatch
    from exgrpo_cli.step.update import UpdatePlan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    Stat,
    compose_config,
    last_json_line,
    log_stderr,
    main_python,
    ratio_stat,
    run_measured,
    table,
    thread_env,
)

VOCAB = 152_064  # Qwen2.5's vocabulary (Qwen2.5-Math-7B's config.json)
PROMPT_TOKENS = 16
SIZES = (512, 2048)  # response tokens of the measured row
PATHS = ("chunked", "full")
TARGET_PER_TOKEN = 0.25  # fp32 [tokens x vocabulary] tensors per added token, chunked (issue #11)
TARGET_SLOWDOWN = 1.05  # chunked / full time per update on the default run
MMAP_THRESHOLD = 65536  # bytes: every larger block gets its own mapping, returned to the OS at free


# ----------------------------------------------------------------------------- paths
@contextmanager
def full_logits_path(on: bool) -> Iterator[None]:
    """Within the block (when `on`), `forward_logprobs` takes the full-logits path for every
    model: `output_head` says the head is not a plain linear map, as it does for soft-capped or
    scaled heads, so the logits come from `response_logits` and the algo functions."""
    from exgrpo_cli.policy import forward

    if not on:
        yield
        return
    original = forward.output_head
    forward.output_head = lambda model: None
    try:
        yield
    finally:
        forward.output_head = original


# ----------------------------------------------------------------------------- memory worker
def _kib(field: str) -> int:
    """VmRSS (resident now) or VmHWM (its high-water mark) of this process, in KiB."""
    from exgrpo_cli.metrics.memory import host_status_bytes

    found = host_status_bytes(field)
    assert found is not None, f"/proc/self/status has no {field}"
    return found // 1024


def tiny_body(vocab: int = VOCAB) -> torch.nn.Module:
    """A Qwen2 body of hidden 64 and one layer with `vocab` tokens, random weights, fp32: the
    vocabulary projection is nearly all of it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(cfg).float()
    model.train()
    return model


def one_row_batch(response_tokens: int, vocab: int, seed: int) -> tuple[MixedBatch, torch.Tensor]:
    """One fresh row of PROMPT_TOKENS + `response_tokens` random tokens, advantage 1."""
    import numpy as np
    import torch

    from exgrpo_cli.data.types import Question
    from exgrpo_cli.replay.mixing import Group, Response, build_mixed_batch

    rng = np.random.default_rng(seed)
    prompt = rng.integers(3, vocab, PROMPT_TOKENS).tolist()
    response = Response(rng.integers(3, vocab, response_tokens).tolist(), None, reward=1.0)
    batch = build_mixed_batch([Group(Question("q", "", ""), prompt, [response])])
    return batch, torch.ones(1)


def memory_plan(micro_batch_tokens: int) -> UpdatePlan:
    """The default run's update settings (algo defaults: exgrpo loss, Dr.GRPO, clip 0.2, the
    entropy bonus 0.001), one micro-batch holding the whole row."""
    from exgrpo_cli.algo.aggregation import drgrpo
    from exgrpo_cli.algo.losses import ExgrpoLoss
    from exgrpo_cli.config.schema import AlgoConfig
    from exgrpo_cli.step.update import UpdatePlan

    a = AlgoConfig()
    return UpdatePlan(
        loss=ExgrpoLoss(clip_eps=a.clip_eps, beta=None),
        aggregation=drgrpo,
        entropy_coef=a.entropy_coef,
        importance_correction=True,
        max_response_tokens=max(SIZES),
        updates=1,
        micro_batch_tokens=micro_batch_tokens,
        grad_clip=a.grad_clip,
        skip_grad_norm_above=float("inf"),
    )


def memory_worker(path: str, tokens: int, threads: int) -> dict[str, Any]:
    import torch

    from exgrpo_cli.metrics.memory import reset_host_peak
    from exgrpo_cli.policy.forward import chunk_tokens
    from exgrpo_cli.step.update import policy_update

    if threads:
        torch.set_num_threads(threads)
    model = tiny_body()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    plan = memory_plan(PROMPT_TOKENS + max(tokens, 16))
    assert plan.entropy_coef > 0, "the measured update must carry the entropy bonus"
    with full_logits_path(path == "full"):
        warm, warm_adv = one_row_batch(16, VOCAB, seed=1)
        policy_update(model, opt, warm, warm_adv, plan, pad_id=0)
        batch, adv = one_row_batch(tokens, VOCAB, seed=2)
        assert reset_host_peak(), "cannot reset VmHWM (Linux >= 4.0 only)"
        before = _kib("VmRSS")
        t0 = time.perf_counter()
        res = policy_update(model, opt, batch, adv, plan, pad_id=0)
        took = time.perf_counter() - t0
        peak = _kib("VmHWM")
    return {
        "path": path,
        "tokens": tokens,
        "vocab": VOCAB,
        "rss_before_mib": before / 1024,
        "hwm_mib": peak / 1024,
        "peak_mib": (peak - before) / 1024,
        "update_s": took,
        "chunk_tokens": chunk_tokens(VOCAB),
        "entropy_sum": res.entropy_sum,
        "threads": torch.get_num_threads(),
        "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
    }


def measure_memory(threads: int, log: Callable[[str], None] = log_stderr) -> dict[str, Any]:
    """Every (path, size) in a fresh process; the peaks and the growth per added token."""
    rows: dict[str, dict[str, Any]] = {}
    for path in PATHS:
        peaks = {}
        for tokens in SIZES:
            args = [main_python(), __file__, "--worker", path, "--tokens", str(tokens)]
            args += ["--threads", str(threads)]
            env = {**thread_env(threads), "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
            proc = run_measured(args, env=env, timeout=900)
            peaks[tokens] = last_json_line(proc.stdout)
            log(f"  memory {path} {tokens} tokens: peak {peaks[tokens]['peak_mib']:.0f} MiB over the RSS")
        lo, hi = SIZES
        growth = (peaks[hi]["peak_mib"] - peaks[lo]["peak_mib"]) * 2**20
        per_token = growth / ((hi - lo) * VOCAB * 4)
        rows[path] = {
            "runs": {str(t): peaks[t] for t in SIZES},
            "peak_mb": {str(t): peaks[t]["peak_mib"] * 2**20 / 1e6 for t in SIZES},
            "bytes_per_token": growth / (hi - lo),
            "vocab_tensors_per_token": per_token,
        }
    chunked = rows["chunked"]["vocab_tensors_per_token"]
    return {
        "vocab": VOCAB,
        "prompt_tokens": PROMPT_TOKENS,
        "sizes": list(SIZES),
        "paths": rows,
        "target_per_token": TARGET_PER_TOKEN,
        "meets_target": chunked <= TARGET_PER_TOKEN,
    }


# ----------------------------------------------------------------------------- speed
def default_step_batch() -> tuple[Any, MixedBatch, torch.Tensor]:
    """The default run's trainer and its step-1 batch (rollouts sampled and graded once)."""
    import torch

    from exgrpo_cli.algo.advantages import group_advantages
    from exgrpo_cli.replay.mixing import build_mixed_batch
    from exgrpo_cli.run.setup import build_trainer

    cfg = compose_config(["trainer.output_dir=/tmp/exgrpo-bench-memory"])
    trainer, _, _ = build_trainer(cfg, torch.device("cpu"))
    try:
        fresh = trainer.state.sampler.draw(cfg.algo.questions_per_step)
        groups = trainer.rollout(fresh, [], 1)
        trainer.score(groups)
    finally:
        trainer.scorer.close()
    batch = build_mixed_batch(groups)
    return trainer, batch, group_advantages(batch.rewards, batch.group_index, cfg.algo.scale_by_std)


def measure_speed(repeats: int, log: Callable[[str], None] = log_stderr) -> dict[str, Any]:
    """`policy_update` on one batch, chunked and full alternating; a warm-up of each first."""
    from exgrpo_cli.step.update import policy_update

    trainer, batch, adv = default_step_batch()
    model, opt, plan = trainer.state.model, trainer.state.optimizer, trainer.update_plan()
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    for i in range(repeats + 1):
        for path in PATHS if i % 2 else PATHS[::-1]:
            with full_logits_path(path == "full"):
                t0 = time.perf_counter()
                policy_update(model, opt, batch, adv, plan, trainer.pad_id, trainer.parallel)
                took = time.perf_counter() - t0
            if i:
                times[path].append(took)
        if i:
            last = {p: f"{v[-1]:.3f} s" for p, v in times.items()}
            log(f"  speed pair {i}/{repeats}: chunked {last['chunked']}, full {last['full']}")
    ratio = ratio_stat(times["chunked"], times["full"])
    return {
        "rows": len(batch),
        "response_tokens": sum(len(r) for r in batch.response_ids),
        "tokens": sum(len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)),
        "vocab": int(model.config.vocab_size),
        "micro_batch_tokens": plan.micro_batch_tokens,
        "repeats": repeats,
        "update_s": {p: Stat(v).as_json() for p, v in times.items()},
        "ratio": ratio.as_json(),
        "target_ratio": TARGET_SLOWDOWN,
        "meets_target": ratio.median <= TARGET_SLOWDOWN,
    }


def run(quick: bool, threads: int = 0, repeats: int | None = None) -> dict[str, Any]:
    import torch

    if threads:
        torch.set_num_threads(threads)
    out: dict[str, Any] = {"threads": torch.get_num_threads()}
    out["memory"] = measure_memory(threads)
    out["speed"] = measure_speed(repeats or (5 if quick else 11))
    return out


def render(res: dict) -> str:
    m, s = res["memory"], res["speed"]
    lo, hi = m["sizes"]
    rows = []
    for path in PATHS:
        r = m["paths"][path]
        rows.append(
            [
                path,
                f"{r['peak_mb'][str(lo)]:.0f}",
                f"{r['peak_mb'][str(hi)]:.0f}",
                f"{r['bytes_per_token'] / 1e6:.3f}",
                f"{r['vocab_tensors_per_token']:.3f}",
            ]
        )
    head = f"update peak over the RSS (1 row, {m['prompt_tokens']} prompt tokens, vocabulary {m['vocab']:,})"
    out = table(
        [head, f"MB at {lo}", f"MB at {hi}", "MB per added token", "[tokens x V] fp32 per token"], rows
    )
    verdict = "meets" if m["meets_target"] else "MISSES"
    target = m["target_per_token"]
    out += f"\nchunked {verdict} the target of <= {target} [tokens x vocabulary] tensors per token"
    up = s["update_s"]
    speed_rows = [
        ["chunked head (as the trainer runs)", Stat(up["chunked"]["values"]).fmt(".3g")],
        ["full logits (the old forward)", Stat(up["full"]["values"]).fmt(".3g")],
        ["chunked / full (paired)", Stat(s["ratio"]["values"]).fmt(".3f") + "x"],
    ]
    speed_head = (
        f"s/update, default run's step-1 batch ({s['rows']} rows, {s['tokens']} tokens, "
        f"{res['threads']} thread(s), {s['repeats']} pairs)"
    )
    out += "\n\n" + table([speed_head, "value"], speed_rows)
    verdict = "within" if s["meets_target"] else "OVER"
    limit = s["target_ratio"] - 1
    out += f"\nchunked is {verdict} the {limit:.0%} slowdown limit (median of the paired ratios)"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    p.add_argument("--repeats", type=int, help="timed pairs of the speed comparison")
    p.add_argument("--worker", choices=PATHS, help="one memory measurement (a fresh process)")
    p.add_argument("--tokens", type=int, default=SIZES[0], help="the worker's response tokens")
    a = p.parse_args()
    if a.worker:
        print(json.dumps(memory_worker(a.worker, a.tokens, a.threads)))
        return
    res = run(a.quick, a.threads, a.repeats)
    print(render(res), file=sys.stderr)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
