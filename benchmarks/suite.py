"""The benchmark suite behind `make bench` (not a test): six side-by-side measurements in one run.

    python benchmarks/suite.py [--quick] [--only vs_trl overhead engines buffer mfu memory] [--threads N]

1. vs_trl.py        exgrpo vs TRL's GRPOTrainer at equal settings (tiny; + smollm2-135m in full)
2. overhead.py      ExGRPO replay (ratio 0.5) vs on-policy (ratio 0) time per step, and its parts
3. engines.py       HF vs vLLM rollout tokens/s at a step's rollout batch, and the weight sync
4. buffer_scale.py  the replay buffer at 1,000,000 experiences: insert / retire / select, bytes/token
5. mfu.py           the update's FLOP/s against a matmul peak measured in the same run
6. memory.py        the update's peak memory per response token at Qwen2.5's vocabulary, chunked
                    log-prob head vs full logits (fresh processes), and the head's time per update

Each section runs in its own process (its workers in the venv they need: .venv-bench for TRL,
.venv-vllm for vLLM; a missing venv skips that side with a note). Every figure is a median over
repeats with its min..max. `--quick` (under 3 minutes on 2 cores for sections 1-5) runs the tiny
model only, with fewer repeats and a 100,000-experience buffer; the full run (under 15 minutes)
adds smollm2-135m. Section 6 is the same in both modes but for its repeats (~100 s on 2 loaded
cores: four fresh processes, the full-logits one at 2,048 tokens holding ~7.5 GB).
The tables are printed and everything goes to benchmarks/results/<date>.json
(<date>-quick.json for --quick).

Threads: both sides of every comparison get the same torch thread count, 1 by default. On a
2-core machine shared with other work, a 2-thread torch process measures the scheduler more than
the code (step times swung 5-10x with a second process running); `--threads 0` uses all cores.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import buffer_scale  # noqa: E402
import engines  # noqa: E402
import memory  # noqa: E402
import mfu  # noqa: E402
import overhead  # noqa: E402
import vs_trl  # noqa: E402
from common import RESULTS, last_json_line, machine_info, main_python, provenance  # noqa: E402

SECTIONS = {
    "vs_trl": vs_trl,
    "overhead": overhead,
    "engines": engines,
    "buffer": buffer_scale,
    "mfu": mfu,
    "memory": memory,
}
TITLES = {
    "vs_trl": "1. exgrpo vs TRL GRPOTrainer",
    "overhead": "2. ExGRPO overhead per step",
    "engines": "3. rollout engines",
    "buffer": "4. replay buffer at scale",
    "mfu": "5. training math (MFU)",
    "memory": "6. log-prob memory per token, chunked vs full logits",
}
THREADED = {"vs_trl", "overhead", "engines", "mfu", "memory"}


def run_section(name: str, quick: bool, threads: int) -> dict:
    module = SECTIONS[name]
    args = [main_python(), module.__file__] + (["--quick"] if quick else [])
    if name in THREADED:
        args += ["--threads", str(threads)]
    t0 = time.perf_counter()
    # stderr streams through (progress lines and the section's table); stdout holds the JSON
    proc = subprocess.run(args, stdout=subprocess.PIPE, text=True)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}", "seconds": took}
    res = last_json_line(proc.stdout)
    res["seconds"] = took
    return res


def render_all(results: dict) -> str:
    parts = []
    for name, res in results["sections"].items():
        parts.append(f"\n## {TITLES[name]}  ({res.get('seconds', 0):.0f} s)\n")
        if "error" in res:
            parts.append(f"failed: {res['error']}")
        elif name == "vs_trl":
            parts.append(res["skipped"] if res.get("skipped") else vs_trl.render(res["results"]))
        else:
            parts.append(SECTIONS[name].render(res))
    return "\n".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the tiny model only, fewer repeats (< 3 min)")
    p.add_argument("--only", nargs="*", choices=list(SECTIONS), help="run these sections only")
    p.add_argument("--threads", type=int, default=1, help="torch threads of every side (0: all cores)")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    t0 = time.perf_counter()
    results = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "threads": a.threads,
        "mode": "quick" if a.quick else "full",
        "machine": machine_info(),
        "provenance": provenance(),
        "sections": {},
    }
    for name in a.only or list(SECTIONS):
        print(f"# {TITLES[name]} ...", file=sys.stderr, flush=True)
        results["sections"][name] = run_section(name, a.quick, a.threads)
    results["total_s"] = time.perf_counter() - t0
    m = results["machine"]
    print(
        f"\n# exgrpo benchmark suite ({results['mode']}, {a.threads or 'all'} torch thread(s), "
        f"{m.get('cpus')} x {m.get('cpu', '?')}, load average at start {m.get('loadavg_start', 0):.1f})"
    )
    print(render_all(results))
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"{dt.date.today().isoformat()}{'-quick' if a.quick else ''}.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"\ntotal {results['total_s']:.0f} s; wrote {path}")


if __name__ == "__main__":
    main()
