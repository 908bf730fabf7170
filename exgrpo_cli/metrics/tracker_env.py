"""The tracker's environment variables, checked before anything of a run is created.

Where it sits: at a command's start-up (commands/__init__.py `dispatch`, for the commands that
log to W&B), and again inside MetricLogger before `wandb.init`. wandb reads its WANDB_* variables
into a pydantic model at `wandb.init`, after a run dir, a lock and a logger exist; an empty
WANDB_MODE, or a value it does not know, came out as pydantic's literal_error traceback. Here an
empty variable is taken as unset (removed from the environment, as a shell's `export WANDB_MODE=`
means), and a value outside what wandb accepts is refused in one line naming the variable and the
allowed values (UsageError, exit 2). The allowed values are wandb's own (wandb/sdk/wandb_settings.py:
`mode`, the booleans pydantic parses, the timeouts as numbers).
"""

from __future__ import annotations

import math
import os
from urllib.parse import urlsplit

from exgrpo_cli.errors import UsageError

MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")
# pydantic's strings for a bool (case-insensitive)
BOOLS = ("0", "1", "true", "false", "yes", "no", "on", "off", "t", "f", "y", "n")
CONSOLES = ("auto", "off", "wrap", "redirect", "wrap_raw", "wrap_emu")
NUMBERS = ("WANDB_INIT_TIMEOUT", "WANDB_FINISH_TIMEOUT")
FLAGS = ("WANDB_SILENT", "WANDB_QUIET")
# the variables exgrpo reads itself, or hands to wandb as they are
TRACKER_VARIABLES = ("WANDB_MODE", "WANDB_BASE_URL", "WANDB_API_KEY", "WANDB_CONSOLE", *NUMBERS, *FLAGS)


def _shown(value: str) -> str:
    text = value.encode("ascii", "backslashreplace").decode()
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _problem(name: str, value: str) -> str | None:
    """What is wrong with `name=value` (a non-empty value), or None when wandb accepts it."""
    if name == "WANDB_MODE" and value not in MODES:
        return f"one of {', '.join(MODES)}"
    if name == "WANDB_CONSOLE" and value not in CONSOLES:
        return f"one of {', '.join(CONSOLES)}"
    if name in FLAGS and value.strip().lower() not in BOOLS:
        return "true or false"
    if name in NUMBERS:
        try:
            ok = math.isfinite(float(value)) and float(value) > 0
        except ValueError:
            ok = False
        return None if ok else "a number of seconds > 0"
    if name == "WANDB_BASE_URL":
        try:  # an unclosed [ of an IPv6 host, or a port that is no number, raises ValueError
            parts = urlsplit(value)
            ok = parts.scheme in ("http", "https") and bool(parts.netloc) and parts.port != 0
        except ValueError:
            ok = False
        return None if ok else "an http(s):// URL"
    return None


def check_tracker_env() -> None:
    """Empty tracker variables are unset; a bad value is refused (UsageError, one line)."""
    for name in TRACKER_VARIABLES:
        value = os.environ.get(name)
        if value is None:
            continue
        if not value.strip():
            del os.environ[name]  # empty means unset, here and for wandb
            continue
        allowed = _problem(name, value)
        if allowed is not None:
            raise UsageError(f"{name}={_shown(value)} is not a value W&B accepts: {allowed} (or unset it)")
