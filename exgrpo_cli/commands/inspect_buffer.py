"""`exgrpo inspect-buffer <run dir | checkpoint dir>`: what a run's replay buffer holds.

A run dir means its latest complete checkpoint. Reads only the checkpoint's files
(`replay/`, `trainer_state.json`, and `model/` for inspect.show / inspect.score) and, for the
replay method it names, the run's `.hydra/config.yaml` (as data, never executed), and writes nothing
into the run it reads: `inspect.plot=true` writes `buffer.png` to `inspect.out_dir`, by default
this command's own run dir (outputs/inspect_buffer/<time>/, which is removed again when the
command wrote nothing there: commands/run_dir.py).

Output: rich text on stdout, or with `--json` (inspect.format=json) one JSON object on stdout and
nothing else there; messages go to stderr. Exit code 1 when the target or the question is not found.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.errors import ExgrpoError, UsageError


def run(cfg: ExgrpoConfig) -> None:
    from rich.console import Console

    from exgrpo_cli.inspection.report import TargetError, buffer_report, resolve_checkpoint, run_replay_method
    from exgrpo_cli.replay.buffer import ExperienceBuffer

    opts = cfg.inspect
    t0 = time.perf_counter()
    try:
        ckpt = resolve_checkpoint(opts.target)
    except TargetError as err:
        raise ExgrpoError(str(err)) from None
    from exgrpo_cli.checkpoint.safe_read import read_json
    from exgrpo_cli.checkpoint.store import verify
    from exgrpo_cli.inspection.show import weights_folder

    weights = f"{weights_folder(ckpt).name}/"
    for part in ("replay/", "trainer_state.json", weights if opts.show else None):  # adapter/: model.lora
        reason = verify(ckpt, prefix=part) if part else None
        if reason:
            raise ExgrpoError(f"{ckpt} does not verify, its files are not read: {reason}")
    state_file = ckpt / "trainer_state.json"
    if not (ckpt / "replay" / "index.json").is_file():
        raise ExgrpoError(f"{ckpt} has no replay buffer (replay/index.json)")
    try:  # files someone else wrote: read as data, a bound they break is one line (exit 2)
        trainer_state = read_json(state_file) if state_file.is_file() else None
        buf = ExperienceBuffer.load(str(ckpt / "replay"))
    except (ValueError, OSError, KeyError, TypeError, RecursionError) as err:
        raise UsageError(
            f"{ckpt}'s replay buffer does not load: {type(err).__name__}: {str(err)[:300]}"
        ) from None
    method, method_from = run_replay_method(ckpt)  # what the run replayed with (display only)
    rep: dict[str, Any] = {
        "checkpoint": str(ckpt),
        "replay_method": method,
        "replay_method_from": method_from,
    }
    rep |= buffer_report(buf, trainer_state)
    rep["seconds"] = round(time.perf_counter() - t0, 3)
    err_console = Console(stderr=True)
    if opts.plot:
        from exgrpo_cli.inspection.plot import plot_report

        out = Path(opts.out_dir or cfg.trainer.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        rep["plot"] = str(plot_report(rep, out / "buffer.png"))
    if opts.show:
        from exgrpo_cli.inspection.show import show_question

        try:
            rep["show"] = show_question(ckpt, buf, opts.show, cfg, opts.score)
        except KeyError as err:
            raise ExgrpoError(err.args[0]) from None
    elif opts.score:
        err_console.print("inspect.score=true needs inspect.show=<question id>; ignored")
    if opts.format == "json":
        print(json.dumps(rep, indent=1))
        return
    console = Console()
    from exgrpo_cli.inspection.render import print_report

    print_report(rep, console)
    if "plot" in rep:
        console.print(f"wrote {rep['plot']}")
    if "show" in rep:
        from exgrpo_cli.inspection.show import print_show

        console.print()
        print_show(rep["show"], console)
