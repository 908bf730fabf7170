"""One training run per run dir: a lock file held for the life of the run.

Where it sits: at the start of `exgrpo train` (run/training.py), after the run dir is known and before
anything in it is read, deleted or written; released when the run ends. Two runs in one dir would
share checkpoints and truncate each other's metrics.jsonl.

Design. The holder's record (pid, host, boot id, the pid's start time, SLURM job id and restart
count, torchrun's run id and parent pid) is written whole to a temporary file in the run dir and
published by os.link to `<run>/.exgrpo.lock`, which fails when the name exists; a hard link is
atomic on local disks and on NFSv3+/Lustre/GPFS, where flock is often a no-op or node-local. So a
lock is never seen empty or half written: an O_EXCL create followed by a write left an empty file
for a moment, which a second start took over as torn while the first went on. (Where hard links
are refused, the lock is created in place with O_EXCL.) The holder refreshes its mtime every
HEARTBEAT_S. A lock found in place is stale, and is taken over, when:
- its host is this host (same boot): the pid is gone, or now belongs to another process (its
  start time differs);
- it was written by this same SLURM job (same SLURM_JOB_ID) at a lower restart count
  (SLURM_RESTART_COUNT): SLURM requeues a job only after its previous allocation ended, and the old
  node's pid cannot be probed from here. Two tasks of one allocation (the same job and count) are
  judged like any two hosts;
- it is unreadable (empty, or not a lock record: a writer killed mid-write, or one without links)
  and has been so for TORN_GRACE_S;
- otherwise (another host): its heartbeat is older than STALE_S, measured against the shared
  filesystem's own clock (the mtime of a file touched now), not this node's, so clock skew
  between nodes cannot make a live lock look stale.
Taking over renames the stale file to a unique name first (only one contender's rename succeeds)
and checks that what it renamed is what it judged stale.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exgrpo_cli.checkpoint.safe_read import UnsafeFile, read_regular
from exgrpo_cli.errors import UsageError

if TYPE_CHECKING:
    from exgrpo_cli.parallel.sharding import DataParallel

LOCK = ".exgrpo.lock"
HEARTBEAT_S = 30.0
STALE_S = 600.0
# an unreadable lock younger than this may be a start between its create and its write
TORN_GRACE_S = 60.0
# os.link's errors on a filesystem without hard links (some FUSE and object-store mounts)
NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK})


class RunDirLocked(UsageError):
    """Another live process holds the run dir."""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str:
    """The kernel's start time of `pid` (distinguishes a reused pid); "" when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def holder_record() -> dict[str, Any]:
    env = os.environ
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "start_time": _start_time(os.getpid()),
        "slurm_job_id": env.get("SLURM_JOB_ID", ""),
        "slurm_restart_count": env.get("SLURM_RESTART_COUNT", "0"),
        "torchrun_id": env.get("TORCHELASTIC_RUN_ID", ""),
        "parent_pid": os.getppid(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def describe(rec: dict[str, Any]) -> str:
    """Who holds the lock `rec`, from the fields it has; a record without a holder's pid and host
    (torn, or written by something else) is described as such, not as 'pid None on host None'."""
    if rec.get("pid") is None or rec.get("host") is None:
        fields = ", ".join(sorted(str(k)[:20] for k in rec)[:6]) or "no fields"
        return f"an unknown holder (the lock names no pid and host; it holds {fields})"
    who = f"pid {rec.get('pid')} on host {rec.get('host')}"
    if rec.get("torchrun_id"):
        who += f" (rank 0 of torchrun {rec['torchrun_id']}, launched by pid {rec.get('parent_pid')})"
    if rec.get("slurm_job_id"):
        who += f", SLURM job {rec['slurm_job_id']}"
    return f"{who}, since {rec['since']}" if rec.get("since") else who


def _fs_now(folder: Path) -> float:
    """The shared filesystem's current time: the mtime of a file written now."""
    probe = folder / f".exgrpo.clock-{secrets.token_hex(4)}"
    probe.write_bytes(b"")
    try:
        return probe.stat().st_mtime
    finally:
        probe.unlink(missing_ok=True)


def _restart_count(value: Any) -> int | None:
    """A recorded SLURM_RESTART_COUNT as a number; None when it is not one."""
    text = str(value).strip()
    return int(text) if text.isdigit() else None


def stale_reason(rec: dict[str, Any], mtime: float, folder: Path) -> str | None:
    """Why the lock `rec` (last heartbeat at `mtime`) is stale, or None when it may be live."""
    me = holder_record()
    if rec.get("host") == me["host"] and rec.get("boot_id") == me["boot_id"]:
        pid = rec.get("pid")
        if not isinstance(pid, int) or not _alive(pid):
            return f"pid {pid} on this host is gone"
        if rec.get("start_time") and _start_time(pid) != rec.get("start_time"):
            return f"pid {pid} now belongs to another process"
        return None
    job = rec.get("slurm_job_id")
    if job and job == me["slurm_job_id"]:
        was, now = _restart_count(rec.get("slurm_restart_count")), _restart_count(me["slurm_restart_count"])
        if was is not None and now is not None and was < now:
            return (
                f"written by restart {was} of this SLURM job {job}, now at restart {now} "
                "(requeued: its allocation ended)"
            )
    age = _fs_now(folder) - mtime
    if age > STALE_S:
        return f"its heartbeat is {age:.0f} s old (more than {STALE_S:.0f} s)"
    return None


class RunLock:
    """The lock of one run dir; `acquire` takes it or raises RunDirLocked, `release` gives it up."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK
        self.record = holder_record()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> str | None:
        """Take the lock; returns a note when a stale lock was taken over."""
        note = None
        for _ in range(3):
            if self._publish():
                self._thread = threading.Thread(target=self._beat, name="exgrpo-run-lock", daemon=True)
                self._thread.start()
                return note
            note = self._take_over_stale()
        raise RunDirLocked(f"{self.path.parent} is locked ({self.path}) and could not be taken over")

    def _publish(self) -> bool:
        """Put this holder's record at the lock's path, whole; False when a lock is there already."""
        temp = self.path.with_name(f"{LOCK}.new-{secrets.token_hex(4)}")
        fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.record, fh)
            try:
                os.link(temp, self.path)
                return True
            except FileExistsError:
                # on NFS a retried link whose first try succeeded answers EEXIST: the count says
                return os.stat(temp).st_nlink > 1
            except OSError as err:
                if err.errno not in NO_LINKS:
                    raise
        finally:
            temp.unlink(missing_ok=True)
        return self._create_in_place()

    def _create_in_place(self) -> bool:
        """Where hard links are refused: O_EXCL create, then write (empty for a moment, which a
        second start sees as unreadable and leaves alone for TORN_GRACE_S)."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            json.dump(self.record, fh)
        return True

    def _read_found(self) -> tuple[bytes, float] | None:
        """The bytes and mtime of the lock found in place (None: it is gone). Read without blocking
        and only when it is a regular file: a FIFO planted there blocked the start for ever in
        open(), a link to /dev/zero read until memory ran out. Anything else is refused."""
        try:
            raw = read_regular(self.path, 4096)
            return raw, os.lstat(self.path).st_mtime
        except UnsafeFile as err:
            if not self.path.is_symlink() and not self.path.exists():
                return None
            raise RunDirLocked(
                f"{self.path.parent} cannot be locked: {err}; a run dir's lock is a regular file "
                f"written by exgrpo train: remove {self.path} if no run uses the dir"
            ) from None
        except FileNotFoundError:
            return None

    def _take_over_stale(self) -> str:
        found = self._read_found()
        if found is None:
            return "a lock that was just released"
        raw, mtime = found
        try:
            rec = json.loads(raw)
        except ValueError:  # torn by a kill while written: its writer died at once
            rec = None
        why: str | None
        if not isinstance(rec, dict):
            what = f"{len(raw)} bytes that are not a lock record ({raw[:40]!r})" if raw else "an empty file"
            age = _fs_now(self.path.parent) - mtime
            if age < TORN_GRACE_S:  # maybe a start between its create and its write
                raise RunDirLocked(
                    f"{self.path.parent} is being locked by another start ({self.path} holds {what}, "
                    f"{max(age, 0):.0f} s old); try again in a minute, or if no run uses the dir remove it"
                )
            why = f"it is unreadable: {what} for {age:.0f} s (a torn write)"
        else:
            why = stale_reason(rec, mtime, self.path.parent)
        if why is None:
            raise RunDirLocked(
                f"{self.path.parent} is in use by exgrpo train {describe(rec or {})}; wait for it to end, "
                f"or if that process is gone for good remove {self.path}"
            )
        aside = self.path.with_name(f"{LOCK}.stale-{secrets.token_hex(4)}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:  # another contender took it over first
            return "a stale lock another start took over"
        try:
            moved = read_regular(aside, 4096)
        except (UnsafeFile, OSError):
            moved = None
        if moved != raw:  # not the file we judged: put it back, and refuse
            os.rename(aside, self.path)
            raise RunDirLocked(f"{self.path.parent} was just locked by another start")
        aside.unlink(missing_ok=True)
        holder = describe(rec) if isinstance(rec, dict) else "an unknown holder"
        return f"took over the stale lock of {holder}: {why}"

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:  # the dir went away; the run's own writes will say so
                return

    def release(self) -> None:
        self._stop.set()
        try:
            rec = json.loads(read_regular(self.path, 4096))
            if (
                isinstance(rec, dict)
                and rec.get("pid") == self.record["pid"]
                and rec.get("host") == self.record["host"]
            ):
                self.path.unlink()
        except (OSError, ValueError):
            pass


def lock_run_dir(out: Path, parallel: DataParallel) -> RunLock | None:
    """Rank 0 creates the run dir and takes its lock (returned; None on other ranks); its refusal,
    or a dir it cannot write, is every rank's (one line, exit 2)."""
    lock, failure = None, None
    if parallel.is_main:
        try:
            out.mkdir(parents=True, exist_ok=True)
            lock = RunLock(out)
            note = lock.acquire()
            if note:
                print(f"exgrpo train: {note}", file=sys.stderr)
        except RunDirLocked as err:
            failure = str(err)
        except OSError as err:
            failure = f"cannot write to the run dir {out}: {err.strerror or err}"
    failure = parallel.from_main(failure)
    if failure is not None:
        raise RunDirLocked(failure)
    return lock
