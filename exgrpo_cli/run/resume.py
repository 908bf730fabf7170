"""Where a run starts from (`trainer.resume`): the checkpoint to resume, and the refusals that need
no model: a run dir a fresh start would clear, a checkpoint of another group size, bucket rule or
training data.

Where it sits: first thing of a run's start (run/training.py `_start`), before the logger, the data
and any weights; build_trainer (run/setup.py) checks the data fingerprint again once the prompts
are filtered. auto continues from the latest complete checkpoint of `trainer.output_dir`; never
starts fresh (and refuses a non-empty dir unless `trainer.overwrite=true`); a path resumes from
that checkpoint.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.checkpoint.store import ResumeRefused
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.parallel.sharding import DataParallel

log = logging.getLogger(__name__)


def _kept(root: Path) -> list[Path]:
    """What a fresh start would delete: published, best and quarantined checkpoints, and complete
    copies of one under another step_* name (step_100.bak)."""
    if not root.is_dir():
        return []
    found = ckpt.complete_checkpoints(root) + ckpt.copies(root)
    found += sorted(root.glob(f"{ckpt.QUARANTINE_PREFIX}*"))
    return found + [p for p in (root / ckpt.BEST,) if p.is_dir()]


def _refuse_or_clear(cfg: ExgrpoConfig) -> str | None:
    """trainer.resume=never: a refusal when the output dir holds checkpoints, the best one or
    quarantined ones (unless trainer.overwrite), naming what would go; else the old checkpoints
    are removed (rank 0 alone calls this)."""
    out = Path(cfg.trainer.output_dir)
    root = out / "checkpoints"
    kept = _kept(root)
    if kept and not cfg.trainer.overwrite:
        names = ", ".join(p.name for p in kept[:6]) + (f" and {len(kept) - 6} more" if len(kept) > 6 else "")
        return (
            f"{out} already holds checkpoints ({names}); trainer.resume=never refuses to delete them "
            "(set trainer.overwrite=true to delete them, or resume=auto)"
        )
    if root.exists():  # overwrite=true: the old run's checkpoints must not mix with the new ones
        shutil.rmtree(root)
    return None


def _nothing_to_resume(root: Path) -> None:
    """resume=auto found no checkpoint to resume: a start from scratch would replace `best/` and
    empty metrics.jsonl, so a dir that still holds the best or quarantined checkpoints refuses."""
    kept = [p for p in _kept(root) if p.name == ckpt.BEST or p.name.startswith(ckpt.QUARANTINE_PREFIX)]
    if kept:
        best = root / ckpt.BEST
        hint = f"trainer.resume={best}" if best.is_dir() else "trainer.resume=<a good checkpoint>"
        raise ResumeRefused(
            f"{root} holds no checkpoint to resume, only {', '.join(p.name for p in kept[:4])}: "
            f"a fresh start would replace them; resume from one with {hint}, or start over with "
            "trainer.resume=never trainer.overwrite=true"
        )


def decide_resume(cfg: ExgrpoConfig, parallel: DataParallel) -> tuple[Path | None, list[str]]:
    """The checkpoint to resume from (None: a fresh start) and warnings to show. A collective:
    the ranks share the verification of the checkpoint's files; rank 0 alone removes or
    quarantines anything. `auto` takes the newest checkpoint that verifies (quarantining newer
    ones that do not, and refusing with exit 2 when none does); an explicit path must verify. A
    `checkpoints` that is not a folder of its own (a symlink to another run's) is refused first,
    on every rank, before anything under it is read or removed."""
    root = Path(cfg.trainer.output_dir) / "checkpoints"
    ckpt.check_root(root)
    r = cfg.trainer.resume
    warnings: list[str] = []
    if parallel.is_main:
        torn = ckpt.clean_torn(root)
        warnings += [f"removed {p.name}: a checkpoint whose writing did not finish" for p in torn]
    parallel.barrier()
    if r == "auto":
        found, more = ckpt.latest_verified(root, parallel)
        if found is None:
            _nothing_to_resume(root)
        return found, warnings + more
    if r == "never":
        refusal = parallel.from_main(_refuse_or_clear(cfg) if parallel.is_main else None)
        if refusal:
            raise ResumeRefused(refusal)
        return None, warnings
    path = Path(r)
    if not (path / ckpt.COMPLETE).is_file():
        raise ResumeRefused(f"trainer.resume={r} is not a complete checkpoint folder")
    reason = ckpt.verify(path, parallel=parallel)
    if reason:
        raise ResumeRefused(f"trainer.resume={r} does not verify: {reason}")
    return path, warnings


def data_fingerprint(questions: list[Question]) -> str:
    """A digest of the training questions' ids in pool order (what the sampler indexes)."""
    h = hashlib.blake2b(digest_size=8)
    for q in questions:
        h.update(q.uid.encode() + b"\0")
    return h.hexdigest()


def check_resume_buffer(cfg: ExgrpoConfig, folder: Path) -> None:
    """Before the logger starts: the rollout.n and replay.bucket_by refusals of check_resume_data."""
    check_resume_data(cfg, folder, None)


def check_resume_data(cfg: ExgrpoConfig, folder: Path, fingerprint: str | None) -> bool:
    """Before the model loads: refuse (ResumeRefused, one line) a resume whose rollout.n or
    replay.bucket_by differs from the checkpoint's, or whose questions differ unless
    trainer.resume_new_data (not compared when `fingerprint` is None); returns whether the run
    continues on new data. Checkpoints written before fingerprints: not checked."""
    try:
        state = ckpt.read_json(folder / "trainer_state.json")
        index = ckpt.read_json(folder / "replay" / "index.json")
        saved_n, saved_rule = index.get("group_size"), index.get("bucket_by", "count")
    except (OSError, ValueError, AttributeError) as err:
        raise ckpt.CheckpointLoadError(f"{folder} does not load: {str(err)[:300]}") from None
    if not isinstance(state, dict):
        raise ckpt.CheckpointLoadError(f"{folder} does not load: trainer_state.json is not a mapping")
    if saved_n != cfg.rollout.n:
        raise ResumeRefused(
            f"rollout.n={cfg.rollout.n}, but {folder} was trained with rollout.n={str(saved_n)[:20]} "
            "(its replay buffer holds groups of that size): resume with that value, or start a new run"
        )
    if saved_rule != cfg.replay.bucket_by:  # its buckets' levels would mean another thing
        raise ResumeRefused(
            f"replay.bucket_by={cfg.replay.bucket_by}, but the replay buffer of {folder} is bucketed by "
            f"{str(saved_rule)[:20]}: resume with that rule, or start a new run"
        )
    saved = state.get("data_fingerprint")
    if fingerprint is None or not saved or saved == fingerprint:
        return False
    if not cfg.trainer.resume_new_data:
        raise ResumeRefused(
            f"the training questions differ from those of {folder} (data fingerprint {fingerprint}, "
            f"the checkpoint's {str(saved)[:20]}): resume with the same data.*, or set "
            "trainer.resume_new_data=true to continue on the new questions (the sampler starts afresh)"
        )
    log.warning("trainer.resume_new_data: continuing %s on other questions", folder)
    return True
