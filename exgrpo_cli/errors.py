"""The exceptions library code raises instead of exiting; `commands/` turns them into exit codes.

`UsageError` (exit 2) is a refusal the user can fix from the command line: a bad config value, a
missing file, a refused resume. Any other `ExgrpoError` (exit 1) is a run that started and could
not go on (e.g. too many skipped updates). Library code never calls `sys.exit`.
"""

from __future__ import annotations


class ExgrpoError(Exception):
    """A failure with a message meant for the user; `exit_code` is what the command exits with."""

    exit_code = 1


class UsageError(ExgrpoError):
    """Bad input: the message names the key, file or value, and what is allowed."""

    exit_code = 2
