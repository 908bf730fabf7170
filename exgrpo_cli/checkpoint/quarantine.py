"""Quarantining a checkpoint that fails verification or loading: renamed out of the rotation, with
the reason beside it.

Where it sits: under checkpoint/store.py (`latest_verified`) and run/training.py (a checkpoint that
verified but does not load); store.py re-exports it. The folder is someone else's data: its
`QUARANTINED.txt` is written without following a link or blocking on a FIFO, so a crafted
checkpoint cannot make the quarantine write outside the run dir or hang.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from pathlib import Path

log = logging.getLogger(__name__)

QUARANTINE_PREFIX = "corrupt-"
NOTE = "QUARANTINED.txt"  # beside a quarantined checkpoint's files: why it was quarantined


def quarantine_target(folder: Path) -> Path:
    """Where `quarantine` will move `folder`: computed before anything in it is parsed."""
    target = folder.parent / f"{QUARANTINE_PREFIX}{folder.name}"
    if os.path.lexists(target):  # a dangling link there too: renaming onto it would fail
        target = folder.parent / f"{QUARANTINE_PREFIX}{folder.name}-{int(time.time())}"
    return target


def quarantine(folder: Path, reason: str, target: Path | None = None) -> Path:
    """Rename a checkpoint that failed verification (or loading) out of the way, with the reason
    beside it (at most 2000 characters)."""
    target = target if target is not None else quarantine_target(folder)
    os.replace(folder, target)
    try:
        _write_note(target, reason[:2000] + "\n")
    except OSError as err:  # quarantined all the same: the reason is in the run's log
        log.warning("%s: could not write %s (%s)", target, NOTE, err.strerror or err)
    return target


def _write_note(folder: Path, text: str) -> None:
    """Write `folder/QUARANTINED.txt` without following a link or blocking: whoever crafted the
    checkpoint may have put a symlink to a file elsewhere (written through), a FIFO (blocks the
    writer for ever) or a hard link to a file elsewhere (truncated in place) under that name. Any
    such entry is unlinked, never followed, and the note created anew; the folder is opened
    without following a link, and the note relative to it."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    dir_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow)
    try:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISDIR(os.stat(NOTE, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                os.unlink(NOTE, dir_fd=dir_fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(NOTE, flags, 0o644, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
