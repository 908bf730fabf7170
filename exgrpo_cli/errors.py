"""The exceptions library code raises instead of exiting, and `exit_on_error`, the one place where
they become exit codes (a command's `dispatch`, and the entry of each rank a command starts).

`UsageError` (exit 2) is a refusal the user can fix from the command line: a bad config value, a
missing file, a refused resume. Any other `ExgrpoError` (exit 1 unless it says otherwise) is a run
that started and could not go on (e.g. too many skipped updates); `SaidElsewhere` is a stop whose
reason another rank says or a log holds. Neither library code nor a command calls `sys.exit` or
raises `SystemExit`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


class ExgrpoError(Exception):
    """A failure with a message meant for the user; `exit_code` is what the command exits with."""

    exit_code = 1


class UsageError(ExgrpoError):
    """Bad input: the message names the key, file or value, and what is allowed."""

    exit_code = 2


class SaidElsewhere(ExgrpoError):
    """A stop with no line of its own: rank 0 says why, or the rank's log holds the traceback."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(f"exit code {exit_code}")
        self.exit_code = exit_code


@contextmanager
def exit_on_error(command: str, say: bool = True) -> Iterator[None]:
    """An `ExgrpoError` raised inside becomes one line on stderr, `exgrpo <command>: <message>`
    (unless not `say`: the ranks other than 0 leave it to rank 0), and its exit code."""
    try:
        yield
    except ExgrpoError as err:
        if say and not isinstance(err, SaidElsewhere):
            print(f"exgrpo {command}: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
