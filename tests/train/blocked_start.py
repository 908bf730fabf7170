"""A start of `exgrpo train` blocked on purpose (tests/train/test_run_dir_specials.py): the run
lock's acquire is replaced by an open() of a FIFO nobody writes, as a FIFO planted at the lock's
place blocked the start before the lock read it without blocking. Writes argv[2] once blocked.

usage: python blocked_start.py <fifo> <ready-marker> <run dir>
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from exgrpo_cli.errors import exit_on_error
from exgrpo_cli.run import lock, training

from conftest import compose_train


def _blocked_acquire(self: lock.RunLock) -> str | None:
    Path(sys.argv[2]).write_text("blocked")
    with open(sys.argv[1], "rb") as fh:  # blocks until a writer opens the FIFO: none will
        fh.read()
    return None


if __name__ == "__main__":
    lock.RunLock.acquire = _blocked_acquire  # type: ignore[method-assign]
    cfg = compose_train([])
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=sys.argv[3]))
    with exit_on_error("train"):
        training.run_training(cfg)
