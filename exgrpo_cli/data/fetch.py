"""Fetching a pinned data file (data/pinned.py) into its folder, verified, safe under concurrency.

Where it sits: at start-up, before any data is read and before any model loads (`exgrpo eval`'s
benchmark loader; `exgrpo train`'s held-out file; the fetch-only mode of both). A missing file is
downloaded into a temporary name in the same folder, its size and sha256 checked, then renamed into
place, so a reader never sees a partial file; the folder is locked (flock on the folder itself,
which leaves no lock file behind) while one process fetches, so 8 ranks or two jobs sharing a cache
download each file once. Every failure removes the temporary file and stops with one line naming
the file, the URL and the folder to put it in by hand (exit 2: `FetchError` is a `UsageError`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from exgrpo_cli.data.pinned import PinnedFile
from exgrpo_cli.errors import UsageError

CHUNK = 1 << 16
OFFLINE_ENV = ("HF_HUB_OFFLINE", "EXGRPO_OFFLINE")  # either one set: the internet is not tried
FALLBACK_DOC = "docs/evaluation.md#no-network-place-the-files-by-hand"

# progress(done_bytes, total_bytes); called once with done=0 before the first byte
Progress = Callable[[int, int], None]


class FetchError(UsageError, ValueError):
    """A pinned file could not be fetched or does not verify; the message is one line."""


def offline() -> bool:
    return any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on") for k in OFFLINE_ENV)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def mismatch(path: Path, pinned: PinnedFile) -> str | None:
    """Why the file at `path` is not the pinned one (size first: no hashing of a wrong-sized file);
    None when it is."""
    size = path.stat().st_size
    if size != pinned.size:
        return f"{size} bytes, expected {pinned.size}"
    got = sha256_of(path)
    return None if got == pinned.sha256 else f"sha256 {got}, expected {pinned.sha256}"


def source_url(pinned: PinnedFile, mirror: str) -> str:
    """The official raw-file URL, or `<mirror>/<name>` (eval.data_url)."""
    return f"{mirror.rstrip('/')}/{pinned.name}" if mirror else pinned.url


def _by_hand(pinned: PinnedFile, url: str, folder: Path) -> str:
    return (
        f"download {url} on a machine with network (or run the command there with "
        f"eval.fetch_only=true) and put it in {folder}, or set eval.data_url=<a mirror serving "
        f"{pinned.name}> ({FALLBACK_DOC})"
    )


def _lock(folder: Path) -> int:
    """An exclusive flock on the folder (a directory fd; closing it releases the lock). The kernel
    releases it when the process ends, even killed, so a crashed fetch never blocks the next one."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        raise
    return fd


def ensure(
    pinned: PinnedFile,
    folder: Path,
    mirror: str = "",
    timeout_s: float = 60.0,
    progress: Progress | None = None,
) -> Path:
    """The verified file `folder/<name>`, fetched when absent. A present file that does not
    verify is refused, never replaced silently (it may be someone's edit)."""
    target = folder / pinned.name
    url = source_url(pinned, mirror)
    if target.is_file():
        _check_present(target, pinned)
        return target
    if offline() and not mirror:
        env = next(k for k in OFFLINE_ENV if os.environ.get(k, "").lower() in ("1", "true", "yes", "on"))
        raise FetchError(
            f"{pinned.name} is not in {folder} and {env} is set (no network): {_by_hand(pinned, url, folder)}"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = _lock(folder)
    except OSError as err:  # a read-only cache, a file where the folder should be
        raise FetchError(
            f"cannot fetch {pinned.name} into {folder} ({err.strerror or err}): set eval.data_dir="
            "<a writable folder> or XDG_CACHE_HOME"
        ) from None
    try:
        return _fetch_locked(pinned, folder, url, timeout_s, progress)
    finally:
        os.close(lock)


def _fetch_locked(
    pinned: PinnedFile, folder: Path, url: str, timeout_s: float, progress: Progress | None
) -> Path:
    target = folder / pinned.name
    if target.is_file():  # another process fetched it while this one waited for the lock
        _check_present(target, pinned)
        return target
    try:
        fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{pinned.name}.", suffix=".part")
    except OSError as err:
        raise FetchError(f"cannot write {pinned.name} into {folder} ({err.strerror or err})") from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            _download(url, out, pinned, folder, timeout_s, progress)
        why = mismatch(tmp, pinned)
        if why:
            raise FetchError(
                f"{pinned.name} from {url} fails its checksum ({why}); it was deleted and "
                f"nothing was kept in {folder}"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _check_present(target: Path, pinned: PinnedFile) -> None:
    why = mismatch(target, pinned)
    if why:
        raise FetchError(
            f"{target} is not the official {pinned.name} ({why}): delete it and run again to fetch "
            f"it anew, or point eval.data_dir at a folder of your own files"
        )


def _download(
    url: str, out: object, pinned: PinnedFile, folder: Path, timeout_s: float, progress: Progress | None
) -> None:
    """Stream `url` into `out`, at most one byte more than the pinned size (a server that sends
    more cannot fill the disk); `timeout_s` bounds the connection and every read."""
    write = out.write  # type: ignore[attr-defined]
    got = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (http(s) URLs only)
            if progress:
                progress(0, pinned.size)
            while got <= pinned.size:
                block = resp.read(min(CHUNK, pinned.size + 1 - got))
                if not block:
                    break
                write(block)
                got += len(block)
                if progress:
                    progress(got, pinned.size)
    except urllib.error.HTTPError as err:
        raise FetchError(
            f"cannot fetch {pinned.name} from {url}: HTTP {err.code} {err.reason}; "
            f"{_by_hand(pinned, url, folder)}"
        ) from None
    except TimeoutError:
        raise FetchError(
            f"fetching {pinned.name} from {url}: no data for {timeout_s:g} s (the server hangs) after "
            f"{got} of {pinned.size} bytes; nothing was kept in {folder}. Raise eval.fetch_timeout_s, or "
            f"{_by_hand(pinned, url, folder)}"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        if got:
            raise FetchError(
                f"fetching {pinned.name} from {url}: the connection broke after {got} of "
                f"{pinned.size} bytes ({reason}); nothing was kept in {folder}. Run again, or "
                f"{_by_hand(pinned, url, folder)}"
            ) from None
        raise FetchError(
            f"cannot fetch {pinned.name} from {url} (no network? {reason}): {_by_hand(pinned, url, folder)}"
        ) from None
    if got != pinned.size:
        what = f"{got} of {pinned.size} bytes" if got < pinned.size else f"more than {pinned.size} bytes"
        raise FetchError(
            f"fetching {pinned.name} from {url}: got {what} (a truncated or wrong file); "
            f"nothing was kept in {folder}"
        )
