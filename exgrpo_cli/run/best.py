"""trainer.keep_best: the best validation score of a run and the checkpoint that keeps it
(`checkpoints/best`). Where it sits: built by run/training.py's loop before the first step, asked
after every validation whether the step is a new best, and told to link the step's checkpoint when
it is; its summary is the run's last line about it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from exgrpo_cli.checkpoint import best_copy
from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.step.state import RunState

log = logging.getLogger(__name__)


class BestCheckpoint:
    """trainer.keep_best: the best validation score so far and the save that keeps a new best
    (checkpoint/store.py). The score lives in the run state (`RunState.best`, in every
    checkpoint), so a resumed run compares with the best of the history it continues, also after
    a roll-back; `checkpoints/best` is the copy a user evaluates. The score is `trainer.best_metric`
    (evaluation/val_scores.py); a best recorded under another criterion does not count."""

    def __init__(self, root: Path, state: RunState, parallel: DataParallel, metric: str) -> None:
        self.root, self.state, self.parallel, self.metric = root, state, parallel, metric
        best, folder = state.best, root / f"step_{state.step}"
        if (
            parallel.is_main
            and best is not None
            and best["step"] == state.step
            and (folder / ckpt.COMPLETE).is_file()
        ):
            try:
                record = best_copy.best_record(root)
            except ckpt.CheckpointError as err:  # malformed: relinked below with the state's record
                log.warning("%s", err)
                record = None
            if record is None or record["step"] != state.step:
                # the run stopped between publishing this step and linking it as the best
                best_copy.keep_best(root, folder, state.step, float(best["score"]), self.metric)

    def improved(self, score: float | None) -> bool:
        """Whether this validation beats the best so far; every rank takes rank 0's decision (a
        save is a collective)."""
        if score is None:  # no validation this step (on every rank alike)
            return False
        best = self.state.best
        if best is not None and best.get("metric", "val/accuracy") != self.metric:
            best = None  # resumed under another criterion: its scores do not compare
        return bool(self.parallel.from_main(best is None or score > float(best["score"])))

    def record(self, step: int, score: float) -> None:
        """Before the save: the checkpoint of this step holds its own best record."""
        self.state.best = {"step": step, "score": score, "metric": self.metric}

    def keep(self, saved: Path | None, step: int, score: float) -> None:
        if saved is not None:  # rank 0
            best_copy.keep_best(self.root, saved, step, score, self.metric)

    def summary(self) -> str:
        try:
            record = best_copy.best_record(self.root) if self.parallel.is_main else None
        except ckpt.CheckpointError as err:  # a run that finished must not crash on it
            return f"best checkpoint: {err}"
        if record is None:
            return "no best checkpoint: the run never validated (no held-out questions)"
        best = self.root / ckpt.BEST
        return (
            f"best checkpoint: {best} (step {record['step']}, {record['metric']} "
            f"{record['score']:.4f}); evaluate it with exgrpo eval model.path={best / 'model'}"
        )
