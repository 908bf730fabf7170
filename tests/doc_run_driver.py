"""Runs documented commands one after another in one process (tests/test_docs_run.py starts it):
`python doc_run_driver.py <steps.json> <results.json>`. One process pays the imports once; each
command goes through `exgrpo_cli.cli.main.main` exactly as `exgrpo <argv>` would.

A step is {"id", "argv", "cwd", "dry": bool, "capture": bool}; a captured step's stdout and stderr
go into its result's "output". `{buffered:<run dir>}` in an argument becomes a
question id held by that run's newest replay buffer. A dry step (`exgrpo ablate ...
ablation.dry_run=true`) also composes every distinct `exgrpo train` command the sweep printed, one
per variant, as that run would compose it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # conftest, doc_checks


def _buffered(run_dir: str) -> str:
    latest = (Path(run_dir) / "checkpoints" / "latest").read_text().strip()
    index = json.loads((Path(run_dir) / "checkpoints" / latest / "replay" / "index.json").read_text())
    return index["questions"][0]


def _resolve(arg: str) -> str:
    return re.sub(r"\{buffered:([^}]+)\}", lambda m: _buffered(m.group(1)), arg)


def _run(argv: list[str]) -> int:
    from exgrpo_cli.cli.main import main

    try:
        main(argv)
    except SystemExit as exit:
        return exit.code if isinstance(exit.code, int) else 1
    return 0


def _compose_printed(printed: str) -> tuple[int, list[str]]:
    """Compose each variant's printed `exgrpo train` command (the first seed of each)."""
    from doc_checks import compose_command

    seen, errors = set(), []
    for line in printed.splitlines():
        if not line.startswith("exgrpo train "):
            continue
        argv = [a for a in shlex.split(line)[2:] if not a.startswith(("hydra.run.dir=", "hydra.sweep."))]
        key = tuple(a for a in argv if not a.startswith(("trainer.seed=", "logger.wandb.name=")))
        if key in seen:
            continue
        seen.add(key)
        try:
            compose_command("train", argv)
        except Exception as err:
            errors.append(f"{line}: {type(err).__name__}: {err}")
    return len(seen), errors


def main() -> None:
    steps_path, results_path = Path(sys.argv[1]), Path(sys.argv[2])  # cli.main rewrites sys.argv
    steps = json.loads(steps_path.read_text())
    results = {}
    for step in steps:
        argv = [_resolve(a) for a in step["argv"]]
        print(f"=== {step['id']}: exgrpo {shlex.join(argv)}", flush=True)
        os.chdir(step["cwd"])
        start = time.perf_counter()
        out = io.StringIO()
        if step.get("dry") or step.get("capture"):
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                rc = _run(argv)
            print(out.getvalue()[-3000:], flush=True)
        else:
            rc = _run(argv)
        result: dict = {"rc": rc, "seconds": round(time.perf_counter() - start, 1), "argv": argv}
        if step.get("capture"):
            result["output"] = out.getvalue()[-20000:]  # a whole `--cfg job` (~9 KB since the replay methods)
        if step.get("dry") and rc == 0:
            result["composed"], result["errors"] = _compose_printed(out.getvalue())
        results[step["id"]] = result
        print(f"=== {step['id']}: exit {rc} in {result['seconds']} s", flush=True)
        results_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
