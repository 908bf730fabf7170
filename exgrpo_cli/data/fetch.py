"""Fetching a pinned data file (data/pinned.py) into its folder, verified, safe under concurrency.

Where it sits: at start-up, before any data is read and before any model loads (`exgrpo eval`'s
benchmark loader; `exgrpo train`'s held-out file; the fetch-only mode of both). A missing file is
downloaded into a temporary name in the same folder (created as any new file is: the umask, a
shared folder's default ACL), its size and sha256 checked, then renamed into place, so a reader
never sees a partial file. While one process fetches it holds an flock on `<folder>/.fetch.lock`
(opened for writing: NFSv4 grants no exclusive lock otherwise; removed by its holder, so nothing is
left behind), so 8 ranks or two jobs sharing a cache download each file once; on a file system
without locks (Lustre mounted without `flock`) the fetch goes on unlocked after a warning, since the
rename is atomic and every copy is verified. Every failure removes the temporary file and stops
with one line naming the file, the URL and the folder to put it in by hand (exit 2: `FetchError` is
a `UsageError`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import http.client
import logging
import os
import secrets
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from exgrpo_cli.data.pinned import PinnedFile
from exgrpo_cli.errors import UsageError

CHUNK = 1 << 16
OFFLINE_ENV = ("HF_HUB_OFFLINE", "EXGRPO_OFFLINE")  # either one set: the internet is not tried
FALLBACK_DOC = "docs/evaluation.md#no-network-place-the-files-by-hand"
LOCK_FILE = ".fetch.lock"
# flock's answers on a file system that has no locks (Lustre without the flock mount option, some
# NFS set-ups), and NFSv4's to an exclusive lock on a file this user may only read
NO_LOCKS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBADF})

log = logging.getLogger(__name__)

# progress(done_bytes, total_bytes); called once with done=0 before the first byte
Progress = Callable[[int, int], None]


class FetchError(UsageError, ValueError):
    """A pinned file could not be fetched or does not verify; the message is one line."""


def offline_env() -> str | None:
    """The variable that marks this machine offline (HF_HUB_OFFLINE=1 ...), None when none does."""
    return next((k for k in OFFLINE_ENV if os.environ.get(k, "").lower() in ("1", "true", "yes", "on")), None)


def offline() -> bool:
    return offline_env() is not None


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(CHUNK), b""):
                h.update(block)
    except OSError as err:  # another user's file in a shared folder, unreadable to this one
        raise FetchError(
            f"cannot read {path} to check it ({err.strerror or err}): make it readable to this user, "
            "or point eval.data_dir at another folder"
        ) from None
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


def _lock(folder: Path) -> int | None:
    """An exclusive flock on `folder/.fetch.lock`, the fd that holds it; None (after a warning) on
    a file system without locks. The kernel releases a lock when its process ends, even killed,
    so a crashed fetch never blocks the next one. The holder removes the file before it lets go
    (`_unlock`), so a lock taken on a file that is no longer the one at the path is retaken."""
    path = folder / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except PermissionError:
            if not os.path.lexists(path):
                raise  # the folder is not writable: nothing can be fetched into it
            try:  # another user's lock file (made under their umask): a read-only fd locks too
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # its holder just removed it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as err:
            os.close(fd)
            if err.errno not in NO_LOCKS:
                raise
            if err.errno != errno.EBADF:  # no locks here at all: no one's lock file to keep
                path.unlink(missing_ok=True)
            _say(
                f"warning: cannot lock {path} ({err.strerror or err}): this file system has no file "
                "locks, so the fetch goes on without one (two processes may download the same file; "
                "each copy is verified and renamed into place whole)"
            )
            return None
        try:
            held = os.fstat(fd)
            now = os.stat(path, follow_symlinks=False)
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                return fd
        except FileNotFoundError:
            pass  # its holder removed it while this process waited: lock the next one
        os.close(fd)


def _unlock(folder: Path, fd: int | None) -> None:
    """Remove the lock file while still holding it (a process waiting on it then retakes the
    lock on a new file), then let go."""
    if fd is None:
        return
    try:
        (folder / LOCK_FILE).unlink(missing_ok=True)
    finally:
        os.close(fd)


def _say(line: str) -> None:
    log.warning(line)
    print(line, file=sys.stderr)


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
    env = offline_env()
    if env and not mirror:
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
        _unlock(folder, lock)


def _fetch_locked(
    pinned: PinnedFile, folder: Path, url: str, timeout_s: float, progress: Progress | None
) -> Path:
    target = folder / pinned.name
    if target.is_file():  # another process fetched it while this one waited for the lock
        _check_present(target, pinned)
        return target
    try:
        fd, tmp = _create_part(folder, pinned.name)
    except OSError as err:
        raise FetchError(f"cannot write {pinned.name} into {folder} ({err.strerror or err})") from None
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


def _create_part(folder: Path, name: str) -> tuple[int, Path]:
    """A new temporary file beside `name`, created as a plain open would create `name` (mode 0o666
    less the umask, a default ACL applied): mkstemp's 0600 would outlive the rename and hide the
    file from the other users of a shared eval.data_dir."""
    for _ in range(100):
        tmp = folder / f".{name}.{secrets.token_hex(6)}.part"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(folder))


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
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
        # http.client's own errors are no OSError: a reply that is not HTTP (BadStatusLine:
        # eval.data_url on another service's port), a chunked body cut short (IncompleteRead)
        reason: object = getattr(err, "reason", err)
        if isinstance(err, http.client.BadStatusLine) and not isinstance(err, OSError):
            reason = f"not an HTTP reply: {str(err)[:80]!r}"
        elif isinstance(err, http.client.HTTPException) and not isinstance(err, OSError):
            reason = repr(err)
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
