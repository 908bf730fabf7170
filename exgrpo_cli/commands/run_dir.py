"""The run folder Hydra makes before a command starts, removed again when the command wrote nothing
into it: a refused command (exit 2), a dry run, an `inspect-buffer` without plots.

Hydra creates `outputs/<command>/<time>/` with `.hydra/` and the log file before `dispatch` runs;
a folder that holds nothing else is the trace of a run that never happened, and a newcomer's
`ls outputs` should not fill up with them. A folder with anything more (a checkpoint, a plan, a
result) is never touched, nor one the user named (`hydra.run.dir=...`, or with `+`/`++` before
it; maybe an existing folder); multirun job folders are left to the sweep.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from exgrpo_cli.config.paths import hydra_config, run_dir_override


def hydra_run_dir() -> tuple[Path, str] | None:
    """(run dir, job name) of a single Hydra run in the folder Hydra chose; None in a multirun job,
    outside Hydra, or when the user named the folder."""
    from hydra.types import RunMode

    hc = hydra_config()
    if hc is None:
        return None
    if hc.mode != RunMode.RUN or any(run_dir_override(o) is not None for o in hc.overrides.hydra):
        return None
    return Path(hc.runtime.output_dir), str(hc.job.name)


def discard_if_untouched() -> bool:
    """Remove the run dir (and the empty folders above it, up to the current one) when it holds
    only Hydra's own files; True when it did."""
    found = hydra_run_dir()
    if found is None:
        return False
    run, job = found
    hydra_own = {".hydra", f"{job}.log"}
    if not run.is_dir() or not {p.name for p in run.iterdir()} <= hydra_own:
        return False
    log_file = (run / f"{job}.log").resolve()
    for handler in list(logging.getLogger().handlers):  # Hydra's file handler holds the log open
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).resolve() == log_file:
            handler.close()
            logging.getLogger().removeHandler(handler)
    shutil.rmtree(run, ignore_errors=True)
    cwd, parent = Path.cwd().resolve(), run.resolve().parent
    while parent != cwd and cwd in parent.parents:
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break
        parent = parent.parent
    return True
