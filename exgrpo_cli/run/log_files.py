"""The run's log files (Hydra's `<run>/train.log`, a rank's log under trainer.nproc): a write the
disk refuses is one line, not a traceback per record; a rank's own log is opened as data.

Where it sits: installed at the start of `exgrpo train` (run/training.py `run_training`, on every
rank) on the root logger's file handlers. logging's own handling of a failed write prints
"--- Logging error ---" and a traceback to stderr for every record; on a full disk that buried the
one line that matters. Here the first failed write of a log file says, once, which file and why,
and that file takes no more lines; the run goes on (its metrics and checkpoints have their own
one-line refusals when the disk stays full, and the checkpoints already written stay intact).

A rank other than 0 opens `<run>/train.rank<k>.log` itself (`open_log`), after the CLI checked the
run dir's other paths: a FIFO there would block that rank in open() until the process group's
timeout, a symlink would append to the file it names. It is refused in one line instead.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
import types
from pathlib import Path

from exgrpo_cli.checkpoint.safe_read import special_entry
from exgrpo_cli.errors import UsageError

GUARD = "_exgrpo_one_line_errors"


def _handle_error(self: logging.FileHandler, record: logging.LogRecord) -> None:
    err = sys.exc_info()[1]
    if not isinstance(err, OSError):  # not the disk: logging's own report
        logging.FileHandler.handleError(self, record)
        return
    self.emit = types.MethodType(lambda _self, _record: None, self)  # type: ignore[method-assign]
    print(
        f"exgrpo train: warning: writing the log {self.baseFilename} failed ({err.strerror or err}); "
        "it takes no more lines (the checkpoints already written are intact)",
        file=sys.stderr,
    )


def guard_log_files(logger: logging.Logger | None = None) -> None:
    """Give every file handler of `logger` (the root logger) the one-line handling above."""
    for handler in (logger or logging.getLogger()).handlers:
        if isinstance(handler, logging.FileHandler) and not getattr(handler, GUARD, False):
            handler.handleError = types.MethodType(_handle_error, handler)  # type: ignore[method-assign]
            setattr(handler, GUARD, True)


def open_log(path: Path) -> logging.FileHandler:
    """A file handler appending to `path`, refused (UsageError, one line) when `path` is there and
    not a regular file. Opened without following a link and without blocking (a FIFO with no
    reader fails at once; one with a reader is refused by fstat), so a swap after the check
    changes nothing."""
    problem = special_entry(path)
    if problem:
        raise UsageError(problem)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        raise UsageError(f"{path} cannot be opened as the rank's log ({err.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{path} is not a regular file, where a run dir holds the rank's log")
    os.set_blocking(fd, True)
    handler = logging.FileHandler(path, delay=True)  # its stream: the descriptor opened here
    handler.stream = os.fdopen(fd, "a", encoding=handler.encoding)
    return handler
