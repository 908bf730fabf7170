"""Reading the small files of a run or checkpoint that someone else may have written.

Where it sits: under every reader of a run dir (checkpoint.verify, resume, eval, inspect-buffer):
a file is read only when it is a regular file (no symlink, FIFO or device: a FIFO blocks a reader
for ever, a link to /dev/zero reads until memory runs out) and under a size cap, and a checkpoint
folder is walked without following links. Errors are `UnsafeFile` with a short message.
`special_entry` says the same of a run dir's path before a writer opens it (the lock, the logs,
metrics.jsonl, .hydra, sweep markers).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 64 * 2**20  # the replay index of a 7B run's buffer is a few MB


class UnsafeFile(ValueError):
    """A file that is not a regular file, or larger than its reader accepts."""


def _name(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 200 else "..." + text[-197:]


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes: opened without following a
    final symlink and without blocking (a FIFO), then checked with fstat."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise UnsafeFile(f"{_name(path)} cannot be opened as a plain file ({err.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{_name(path)} is not a regular file (a link, a pipe or a device)")
        if st.st_size > limit:
            raise UnsafeFile(f"{_name(path)} is {st.st_size} bytes, more than the {limit} allowed")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(f"{_name(path)} grew past the {limit} bytes allowed while read")
    return data


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    """JSON of a regular file of at most `limit` bytes (UnsafeFile, or ValueError when not JSON)."""
    return json.loads(read_regular(path, limit).decode("utf-8"))


def irregular_entry(folder: Path) -> str | None:
    """The first entry under `folder` that is neither a regular file nor a directory (symlinks
    included, never followed), as a message; None when there is none."""
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
                return f"{_name(path)}: {kind}; a checkpoint holds regular files only"
    return None


def special_entry(path: Path, folder_ok: bool = False) -> str | None:
    """`path` as a one-line refusal when it exists and is not a regular file (nor, with
    `folder_ok`, a folder): a FIFO, a device, a socket or a symlink, never followed (a FIFO blocks
    whoever opens it, a link writes through to where it points). None when absent or plain."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"{_name(path)} cannot be examined ({err.strerror})"
    if stat.S_ISREG(mode) or (folder_ok and stat.S_ISDIR(mode)):
        return None
    kinds = [
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ]
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    allowed = "a regular file or a folder" if folder_ok else "a regular file"
    return f"{_name(path)} is {kind}, where a run dir holds {allowed}: remove it, or use another run dir"
