"""Checkpoints on disk: written atomically by every rank, verified before they are trusted.

Where it sits: around the step. `RunState.save` (step/state.py) hands `save_checkpoint` a
`write(folder)` that every rank runs into the same temporary folder (rank 0 writes the model, the
buffer and the trainer state; every rank its own part of the sharded optimizer state). Then every
file's SHA-256 is taken (the ranks share the hashing), and rank 0 writes `COMPLETE` with that
manifest, fsyncs, renames the folder into place and points `latest` at it. A run killed midway
leaves a `.tmp-step_<N>` folder without `COMPLETE`: never resumed, removed at the next start.

Before a checkpoint is trusted (resume, eval, inspect-buffer), `verify` re-hashes the files it
will read against the manifest. A checkpoint that fails is quarantined: renamed to
`corrupt-step_<N>` (so that `keep_checkpoints` never counts it and nothing resumes it) with a
`QUARANTINED.txt` saying which file failed; resume then falls back to the newest one that verifies.
Pruning only ever removes checkpoints older than the one just written and verified.

Layout of `<output_dir>/checkpoints/step_<N>/` (step/state.py writes it):
  model/         HF folder: AutoModelForCausalLM.from_pretrained (and vLLM) load it
  optimizer/     the optimizer state, one file per rank (torch.distributed.checkpoint)
  replay/        the experience buffer; rng.safetensors; trainer_state.json
  config.json    the config sections it was trained with (compared at resume: run/resume_changes.py)
  COMPLETE       {"step", "format", "world_size", "files": {path: {"bytes", "sha256"}}}

With trainer.keep_best, `checkpoints/best/` holds the checkpoint of the best validation score so
far (hard links to a published step_<N>'s files, plus BEST.json with its step and score): outside
the step_* rotation, so never pruned nor resumed, and readable by `exgrpo eval` like any checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from exgrpo_cli.checkpoint import safe_read
from exgrpo_cli.checkpoint.files import (
    COMPLETE,
    _files,
    _fsync_tree,
    _shared_digests,
    file_sha256,  # noqa: F401 - re-exported: callers use ckpt.file_sha256
    optimizer_state_from_files,  # noqa: F401 - re-exported
    os_error_in,
    write_json,
)
from exgrpo_cli.checkpoint.quarantine import (  # re-exported: callers use ckpt.quarantine
    NOTE,
    QUARANTINE_PREFIX,
    quarantine,
    quarantine_target,
)
from exgrpo_cli.checkpoint.safe_read import read_json
from exgrpo_cli.errors import ExgrpoError, UsageError
from exgrpo_cli.parallel.sharding import DataParallel

log = logging.getLogger(__name__)

LATEST = "latest"
OPTIMIZER = "optimizer/"  # the sharded optimizer state's folder in a checkpoint
BEST = "best"
BEST_SCORE = "BEST.json"
FORMAT = 2
# the only folder names of the step rotation: a user's copy (`cp -r step_100 step_100.bak`) is
# neither resumed nor pruned
STEP_NAME = re.compile(r"step_([0-9]+)")
# Fault injection for the tests: set to a step number, the process SIGKILLs itself midway through
# writing that checkpoint, or its write fails as on a full disk (ENOSPC)
FAULT_KILL_IN_CHECKPOINT = "EXGRPO_FAULT_KILL_IN_CHECKPOINT"
FAULT_DISK_FULL_IN_CHECKPOINT = "EXGRPO_FAULT_DISK_FULL_IN_CHECKPOINT"


class CheckpointError(UsageError):
    """A checkpoint named by the user cannot be used, or none of a run's checkpoints verifies."""


class ResumeRefused(UsageError):
    """trainer.resume cannot be honoured; nothing was changed on disk."""


class CheckpointLoadError(ExgrpoError):
    """A checkpoint that verified fails to load: quarantined and fallen back from like a corrupt one."""


class CheckpointWriteError(ExgrpoError):
    """Writing a checkpoint failed (disk full, I/O error): the previous checkpoints are intact."""


# ----------------------------------------------------------------------------- writing


def save_checkpoint(
    ckpt_root: Path, step: int, write: Callable[[Path], None], keep: int, parallel: DataParallel | None = None
) -> Path | None:
    """Run `write(tmp)` on every rank, then publish step_<step> atomically (see the module
    docstring). A collective under torchrun: every rank calls it. Returns the checkpoint's path on
    rank 0 (None elsewhere). A failed write raises CheckpointWriteError on every rank and leaves
    the published checkpoints as they were."""
    parallel = parallel or DataParallel()
    main = parallel.is_main
    final, parent = ckpt_root / f"step_{step}", ckpt_root / f".tmp-step_{step}"
    # each writer (a run: its rank 0's choice, shared) has its own folder under .tmp-step_<N>: two
    # processes that ever write into one run dir never mix their files (the run lock should
    # prevent it; this makes it harmless)
    writer = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}" if main else ""
    writer = parallel.from_main(writer)
    tmp = parent / writer
    if main:
        tmp.mkdir(parents=True)
    parallel.barrier()
    error = None
    try:
        write(tmp)
    except BaseException as err:  # torch's writer raises a BaseException around a rank's OSError
        cause = os_error_in(err)
        if cause is None:
            raise
        error = f"{type(cause).__name__}: {str(cause)[:300]}"
    errors = [e for e in parallel.gather(error) if e]
    if errors:
        raise CheckpointWriteError(
            f"writing checkpoint step_{step} failed ({errors[0]}); the checkpoints already in "
            f"{ckpt_root} are intact, and the next start removes the partial one and resumes from them"
        )
    if main and os.environ.get(FAULT_KILL_IN_CHECKPOINT) == str(step):
        os.kill(os.getpid(), signal.SIGKILL)
    parallel.barrier()  # every rank's files are written before anyone hashes them
    names = _files(tmp) if main else []
    names = parallel.from_main(names)
    digests = _shared_digests(tmp, names, parallel)
    if main:
        write_json(
            tmp / COMPLETE,
            {"step": step, "format": FORMAT, "world_size": parallel.world_size, "files": digests},
        )
        _fsync_tree(tmp)
        if final.exists():  # a re-save of the same step (e.g. the final one): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        with contextlib.suppress(OSError):  # another writer's folder still in it: removed at a start
            parent.rmdir()
        pointer_tmp = ckpt_root / f".{LATEST}.tmp"
        pointer_tmp.write_text(final.name)
        with open(pointer_tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(pointer_tmp, ckpt_root / LATEST)
        _prune(ckpt_root, keep, protect=final)
    parallel.barrier()  # nobody reads or deletes checkpoints while rank 0 publishes one
    return final if main else None


def disk_fault(step: int) -> None:
    """The disk-full fault of the tests (FAULT_DISK_FULL_IN_CHECKPOINT): call it where a rank writes
    files on its own, never inside a collective (the other ranks would wait for it)."""
    if os.environ.get(FAULT_DISK_FULL_IN_CHECKPOINT) == str(step):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "checkpoint (fault injection)")


def _step_of(p: Path) -> int:
    """N of a folder of `complete_checkpoints`, which lists only names step_<digits>."""
    return int(p.name.removeprefix("step_"))


def _prune(ckpt_root: Path, keep: int, protect: Path) -> None:
    """Keep the newest `keep` checkpoints; `protect` was just written and verified, so everything
    removed here is older than a verified checkpoint. Quarantined ones are never touched."""
    done = sorted(complete_checkpoints(ckpt_root), key=_step_of)
    for old in done[:-keep]:
        if old != protect and _step_of(old) < _step_of(protect):
            shutil.rmtree(old, ignore_errors=True)


def clean_torn(ckpt_root: Path) -> list[Path]:
    """Remove leftovers of writes that were killed or failed; returns what was removed."""
    stale = list(ckpt_root.glob(".tmp-step_*")) if ckpt_root.is_dir() else []
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


# ----------------------------------------------------------------------------- reading


def complete_checkpoints(ckpt_root: Path) -> list[Path]:
    """The folders of the step rotation: named step_<N> (N digits), a folder of their own (not a
    link, which would resume, prune or quarantine what it points at), with their COMPLETE."""
    return [p for p in _complete(ckpt_root) if STEP_NAME.fullmatch(p.name)]


def copies(ckpt_root: Path) -> list[Path]:
    """Complete folders named step_* that are not step_<N> (a user's `step_100.bak`): never
    resumed nor pruned, but named by trainer.resume=never before it deletes anything."""
    return [p for p in _complete(ckpt_root) if not STEP_NAME.fullmatch(p.name)]


def _complete(ckpt_root: Path) -> list[Path]:
    if not ckpt_root.is_dir():
        return []
    found = ckpt_root.glob("step_*")
    return sorted(p for p in found if not p.is_symlink() and p.is_dir() and (p / COMPLETE).is_file())


def check_root(ckpt_root: Path) -> None:
    """Refuse (ResumeRefused, one line) a run dir whose `checkpoints` is there but not a folder of
    its own: a symlink (`checkpoints -> ../other_run/checkpoints` would resume another run's
    checkpoint, then write, prune and delete in that run), a file, a FIFO, a device. Called before
    anything under it is read or written."""
    try:
        mode = os.lstat(ckpt_root).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise ResumeRefused(f"{ckpt_root} cannot be examined ({err.strerror})") from None
    if stat.S_ISDIR(mode):
        return
    link = stat.S_ISLNK(mode)
    kind = "a symlink" if link else "a file" if stat.S_ISREG(mode) else "a special file"
    why = " (a link would resume, prune and delete another folder's checkpoints)" if link else ""
    raise ResumeRefused(
        f"{ckpt_root} is {kind}, where a run dir holds its own checkpoints folder{why}: remove it, "
        "or use another run dir"
    )


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The checkpoint `latest` names if complete, else the newest complete one, else None
    (not verified: see `latest_verified`)."""
    candidates = resume_candidates(ckpt_root)
    return candidates[0] if candidates else None


def resume_candidates(ckpt_root: Path) -> list[Path]:
    """The complete checkpoints a resume may take, best first: the one `latest` names, then the
    older ones, newest first. Newer ones than `latest` are left out: a run rolled back with
    trainer.resume=<older step> abandoned them (it replaces each as it saves that step again).
    Without a usable pointer, every complete checkpoint, newest first."""
    done = sorted(complete_checkpoints(ckpt_root), key=_step_of, reverse=True)
    try:  # a folder name: a regular file of a few bytes (a huge sparse one is never read whole)
        name = safe_read.read_regular(ckpt_root / LATEST, 256).decode("utf-8", "replace").strip()
    except safe_read.UnsafeFile:
        name = ""
    if name:
        named = ckpt_root / name
        if named in done:
            return [named] + [p for p in done if _step_of(p) < _step_of(named)]
    return done


# files of ours beside a checkpoint's manifest, at its top level: never listed in it
SIDECARS = (BEST_SCORE, NOTE)


def verify(folder: Path, prefix: str = "", parallel: DataParallel | None = None) -> str | None:
    """None when every file of checkpoint `folder` under `prefix` ("" = all, "model/", "replay/")
    has the size and SHA-256 its COMPLETE manifest records, else the first problem, naming the
    file. Refused as well: anything in the folder that is not a regular file or directory (a
    symlink, a FIFO, a device), a file the manifest does not list, a manifest without its file
    list. A checkpoint written before manifests existed (a marker without a format) passes with a
    warning. When the optimizer state is covered, its metadata must also be data. Collective when
    `parallel` is distributed (the ranks share the hashing)."""
    marker = folder / COMPLETE
    if not marker.is_file():
        return f"{folder}: no {COMPLETE} marker (a torn or foreign folder)"
    try:
        record = read_json(marker)
    except (ValueError, OSError) as err:  # UnsafeFile and JSONDecodeError are ValueErrors
        return f"{marker}: unreadable ({str(err)[:200]})"
    odd = safe_read.irregular_entry(folder)
    if odd is not None:
        return odd
    manifest = record.get("files") if isinstance(record, dict) else None
    if manifest is None and isinstance(record, dict) and "format" not in record:
        log.warning("%s predates checkpoint checksums: its files cannot be verified", folder)
    else:
        reason = _manifest_shape(folder, manifest)
        if reason is None and isinstance(manifest, dict):  # a dict whenever the shape passed
            reason = _manifest_problem(folder, manifest, prefix, parallel or DataParallel())
        if reason is not None:
            return reason
    if OPTIMIZER.startswith(prefix):
        # the checksums say the file is as written, not that what was written is data: the
        # metadata torch would unpickle is parsed as data first (checkpoint/metadata_guard.py)
        from exgrpo_cli.checkpoint.metadata_guard import refusal

        return refusal(folder / OPTIMIZER)
    return None


def _manifest_shape(folder: Path, manifest: Any) -> str | None:
    """A problem with the manifest's own shape, or a file on disk that it does not list."""
    marker = folder / COMPLETE
    if not isinstance(manifest, dict):
        return f"{marker}: a manifest without its file list"
    for name, entry in manifest.items():
        parts = PurePosixPath(name).parts
        if not parts or PurePosixPath(name).is_absolute() or ".." in parts or name == COMPLETE:
            return f"{marker}: lists {name[:100]!r}, not a file inside the checkpoint"
        ok = isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
        if not ok or isinstance(entry.get("bytes"), bool) or not isinstance(entry.get("bytes"), int):
            return f"{marker}: the entry of {name[:100]!r} is not a size and a checksum"
    unlisted = [n for n in _files(folder) if n not in manifest and n not in SIDECARS]
    if unlisted:
        return f"{folder / unlisted[0]}: not listed in the manifest (added after the checkpoint was written)"
    return None


def _manifest_problem(
    folder: Path, manifest: dict[str, Any], prefix: str, parallel: DataParallel
) -> str | None:
    wanted = sorted(n for n in manifest if n.startswith(prefix))
    found = _shared_digests(folder, wanted, parallel)
    for name in wanted:
        got, want = found.get(name), manifest[name]
        if got is None:
            return f"{folder / name}: missing"
        if got["bytes"] != want["bytes"]:
            return f"{folder / name}: {got['bytes']} bytes, the manifest says {want['bytes']}"
        if got["sha256"] != want["sha256"]:
            return f"{folder / name}: checksum mismatch (the file changed after it was written)"
    return None


def latest_verified(ckpt_root: Path, parallel: DataParallel | None = None) -> tuple[Path | None, list[str]]:
    """The first checkpoint of `resume_candidates` (`latest`'s, then older ones) that verifies,
    quarantining those before it that do not (rank 0 renames; a collective under torchrun).
    Returns (checkpoint or None, warnings). Raises CheckpointError when there are checkpoints and
    none verifies."""
    parallel = parallel or DataParallel()
    warnings: list[str] = []
    for folder in resume_candidates(ckpt_root):
        target = quarantine_target(folder)  # before anything untrusted is parsed
        reason = verify(folder, parallel=parallel)
        if reason is None:
            return folder, warnings
        if parallel.is_main:
            quarantine(folder, reason, target)
        parallel.barrier()
        warnings.append(
            f"checkpoint {folder.name} failed verification ({reason}); quarantined as "
            f"{QUARANTINE_PREFIX}{folder.name}, resuming from an older one if any verifies"
        )
    if warnings:
        raise CheckpointError(
            f"no checkpoint in {ckpt_root} verifies ({'; '.join(warnings)}); nothing was deleted. "
            "Start over with trainer.resume=never trainer.overwrite=true, or point trainer.resume "
            "at a good copy"
        )
    return None, warnings
