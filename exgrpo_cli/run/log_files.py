"""The run's log files (Hydra's `<run>/train.log`, a rank's log under trainer.nproc): a write the
disk refuses is one line, not a traceback per record.

Where it sits: installed at the start of `exgrpo train` (run/training.py `run_training`, on every
rank) on the root logger's file handlers. logging's own handling of a failed write prints
"--- Logging error ---" and a traceback to stderr for every record; on a full disk that buried the
one line that matters. Here the first failed write of a log file says, once, which file and why,
and that file takes no more lines; the run goes on (its metrics and checkpoints have their own
one-line refusals when the disk stays full, and the checkpoints already written stay intact).
"""

from __future__ import annotations

import logging
import sys
import types

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
