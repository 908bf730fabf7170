"""The run's best checkpoint (`trainer.keep_best`): `checkpoints/best`, a hard-linked copy of the
published checkpoint with the best validation score, and its `BEST.json` record.

Where it sits: after a checkpoint is published and validated (run/best.py decides when); read back
at resume to carry the best score on. The record is data: read size-capped and checked field by
field (`check_best`); the copy is swapped in atomically, and a swap killed midway is finished at
the next read.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

from exgrpo_cli.checkpoint.files import COMPLETE, _fsync_tree, write_json
from exgrpo_cli.checkpoint.safe_read import read_json
from exgrpo_cli.checkpoint.store import BEST, BEST_SCORE, CheckpointError


def best_record(ckpt_root: Path) -> dict[str, Any] | None:
    """{"step", "score", "metric"} of `ckpt_root/best`, or None when there is none. A swap that was
    killed midway (only `.old-best` left) is finished first."""
    best, old = ckpt_root / BEST, ckpt_root / f".old-{BEST}"
    if not best.is_dir() and old.is_dir():
        os.replace(old, best)
    record = best / BEST_SCORE
    if not (best / COMPLETE).is_file() or not os.path.lexists(record):
        return None
    return check_best(record)


def check_best(path: Path) -> dict[str, Any]:
    """BEST.json's content: an object with "step" (an int >= 0), "score" (a finite number) and
    optionally "metric" (a string naming the criterion, e.g. "val/accuracy"), nothing else.
    Raises CheckpointError for anything else (a malformed file, named)."""
    try:
        rec = read_json(path, limit=4096)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: malformed ({str(err)[:200]})") from None
    ok = isinstance(rec, dict) and {"step", "score"} <= set(rec) <= {"step", "score", "metric"}
    step, score = (rec.get("step"), rec.get("score")) if isinstance(rec, dict) else (None, None)
    ok = ok and isinstance(step, int) and not isinstance(step, bool) and step >= 0
    ok = ok and isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score)
    ok = ok and isinstance(rec.get("metric", ""), str)
    if not ok:
        raise CheckpointError(
            f'{path}: malformed (wants {{"step": int >= 0, "score": a finite number, "metric": a name}})'
        )
    return dict(rec)


def keep_best(ckpt_root: Path, folder: Path, step: int, score: float, metric: str) -> Path:
    """Make checkpoint `folder` (published, verified) the run's best: `ckpt_root/best` becomes a
    copy of it made of hard links (no bytes copied; a plain copy where the filesystem has none),
    swapped in atomically. Rank 0 only."""
    tmp, best, old = ckpt_root / f".tmp-{BEST}", ckpt_root / BEST, ckpt_root / f".old-{BEST}"
    for leftover in (tmp, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    for src in sorted(p for p in folder.rglob("*") if p.is_file()):
        dst = tmp / src.relative_to(folder)
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    write_json(tmp / BEST_SCORE, {"step": step, "score": score, "metric": metric})
    _fsync_tree(tmp)
    if best.exists():
        os.replace(best, old)
    os.replace(tmp, best)
    shutil.rmtree(old, ignore_errors=True)
    return best
