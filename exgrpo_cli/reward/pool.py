"""A pool of persistent verification processes with a hard per-item timeout.

Part of the reward stage of the train step (after rollouts, before the replay buffer update):
`RewardScorer` sends every (gold, extracted) pair that the cheap checks could not settle here.

Why processes: math-verify's timeouts use `signal.alarm`, which only works in a process's main
thread, and some sympy work ignores signals anyway (long C-level big-number arithmetic). So each
worker (`verify.worker_main`) runs math-verify in its own main thread, and the parent, which only
waits on pipes and so may run in any thread, enforces a hard deadline: a worker that has not
answered an item `timeout_s + SLACK_S` after it got it is terminated (then killed), the item
counts as a timeout, and a fresh worker takes its place. A worker that dies mid-item (killed,
segfault, out of memory) is replaced and the item counts as an error. Workers are started with
the "spawn" context, so they share nothing with a parent that runs torch threads; being spawned,
they re-import the parent's `__main__` module, which therefore needs the usual
`if __name__ == "__main__":` guard (the `exgrpo` console script and pytest have one).

Items go to idle workers one at a time (a pipe round trip costs tens of microseconds, a
math-verify check about 2 ms), so each deadline is exactly one item's.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_any
from typing import Any, cast

from exgrpo_cli.reward.verify import worker_main

log = logging.getLogger(__name__)

MAX_FAILED_STARTS = 3  # consecutive workers dying before "ready": the environment is broken
SLACK_S = 1.0  # an item's hard deadline: its timeout_s plus this
STARTUP_TIMEOUT_S = 120.0  # a worker not ready by then failed to start
_MAX_WAIT_S = 1.0  # re-check state at least this often while a call is in progress


@dataclass
class _Worker:
    proc: mp.process.BaseProcess
    conn: mp.connection.Connection
    started: float
    ready: bool = False
    seq: int | None = None  # the item in flight (None: idle)
    index: int = -1  # its position in the current call
    deadline: float = 0.0


@dataclass
class _Call:
    """State of one `VerifyPool.run`: outcomes so far and the items not yet handed out."""

    items: list[tuple[str, str]]
    timeout_s: float
    results: list[tuple[str, bool] | None]
    pending: deque[int] = field(default_factory=deque)
    outstanding: int = 0

    def finish(self, index: int, status: str, correct: bool) -> None:
        if self.results[index] is None:
            self.results[index] = (status, correct)
            self.outstanding -= 1


def _stop(worker: _Worker, graceful: bool = False) -> None:
    """End a worker process for good: ask (optionally), terminate, then kill; reap it."""
    proc = worker.proc
    if graceful and proc.is_alive():
        try:
            worker.conn.send(None)
        except (OSError, ValueError):
            pass
        proc.join(0.2)
    try:
        worker.conn.close()
    except OSError:
        pass
    if proc.is_alive():
        proc.terminate()
        proc.join(0.5)
    if proc.is_alive():
        proc.kill()
        proc.join(2.0)
    try:
        proc.close()
    except ValueError:  # still running after SIGKILL (uninterruptible sleep): leave it to the OS
        pass


def _shutdown(workers: list[_Worker]) -> None:
    """Finalizer (also run at interpreter exit): stop every worker in `workers`."""
    while workers:
        _stop(workers.pop(), graceful=True)


class VerifyPool:
    """`workers` verification processes; `run` checks a batch of prepared (gold, pred) pairs.

    Calls from several threads are serialised. Processes start at construction (in the
    background: the first `run` waits for them, about a second on a quiet machine)."""

    def __init__(self, workers: int = 1, memory_limit_mb: int | None = 2048) -> None:
        if workers < 1:
            raise ValueError(f"reward workers must be >= 1, got {workers}")
        self._ctx = mp.get_context("spawn")
        self._memory_limit_mb = memory_limit_mb
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._failed_starts = 0
        self.restarts = 0  # workers replaced after a timeout or a crash (cumulative)
        self._workers: list[_Worker] = []
        # the finalizer holds the list, not the pool, so an unreferenced pool is still collected
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        for _ in range(workers):
            self._workers.append(self._spawn())

    # ---- lifecycle -------------------------------------------------------------------------
    def _spawn(self) -> _Worker:
        parent_end, child_end = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=worker_main, args=(child_end, self._memory_limit_mb), daemon=True, name="exgrpo-reward"
        )
        proc.start()
        child_end.close()  # so that the worker's death shows up as EOF on our end
        return _Worker(proc, parent_end, time.monotonic())

    def _replace(self, k: int) -> None:
        _stop(self._workers[k])
        self._workers[k] = self._spawn()
        self.restarts += 1

    def close(self) -> None:
        """Stop all workers; idempotent. `run` after `close` raises."""
        with self._lock:
            self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def pids(self) -> list[int | None]:
        """Process ids of the current workers (for tests and diagnostics)."""
        return [w.proc.pid for w in self._workers]

    # ---- one batch -------------------------------------------------------------------------
    def run(self, items: list[tuple[str, str]], timeout_s: float) -> list[tuple[str, bool]]:
        """(status, correct) per (gold, pred) item; status is "ok", "timeout" or "error".

        Raises RuntimeError only when workers cannot start at all (a broken environment)."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the reward verification pool is closed")
            call = _Call(items, timeout_s, [None] * len(items), deque(range(len(items))), len(items))
            try:
                while call.outstanding:
                    self._dispatch(call)
                    self._wait(call)
                    self._enforce_deadlines(call)
            finally:
                # an interrupted call must not leave answers in flight for the next one
                for k, w in enumerate(self._workers):
                    if w.seq is not None:
                        self._replace(k)
            # every entry is set once outstanding is 0
            return cast("list[tuple[str, bool]]", call.results)

    def _dispatch(self, call: _Call) -> None:
        for k, w in enumerate(self._workers):
            if not call.pending:
                return
            if not w.ready or w.seq is not None:
                continue
            index = call.pending.popleft()
            seq = next(self._seq)
            gold, pred = call.items[index]
            try:
                w.conn.send((seq, gold, pred, call.timeout_s))
            except (OSError, ValueError):  # died while idle (e.g. killed between calls)
                call.pending.appendleft(index)
                log.warning("reward worker %s died while idle; starting a new one", w.proc.pid)
                self._replace(k)
                continue
            w.seq, w.index = seq, index
            w.deadline = time.monotonic() + call.timeout_s + SLACK_S

    def _wait(self, call: _Call) -> None:
        now = time.monotonic()
        deadlines = [
            w.deadline if w.ready else w.started + STARTUP_TIMEOUT_S
            for w in self._workers
            if w.seq is not None or not w.ready
        ]
        timeout = min([_MAX_WAIT_S] + [max(0.0, d - now) for d in deadlines])
        handles: dict[Any, int] = {}  # a worker's pipe and its process sentinel -> its index
        for k, w in enumerate(self._workers):
            handles[w.conn] = k
            handles[w.proc.sentinel] = k
        fired = {handles[h] for h in wait_any(list(handles), timeout)}
        for k in sorted(fired):
            self._collect(k, call)

    def _collect(self, k: int, call: _Call) -> None:
        """Read everything worker k has sent; replace it if it has died."""
        w = self._workers[k]
        dead = False
        try:
            while w.conn.poll():
                msg = w.conn.recv()
                if msg[0] == "ready":
                    w.ready = True
                    self._failed_starts = 0
                elif msg[0] == w.seq:
                    call.finish(w.index, msg[1], msg[2])
                    w.seq = None
        except (EOFError, OSError):
            dead = True
        if not dead and w.proc.is_alive():
            return
        if w.seq is not None:
            log.warning(
                "reward worker %s died on an item (exit code %s); scoring it 0 as an error",
                w.proc.pid,
                w.proc.exitcode,
            )
            call.finish(w.index, "error", False)
            w.seq = None
        elif not w.ready:
            self._failed_start(k, f"exit code {w.proc.exitcode}")
            return
        else:
            log.warning("reward worker %s died while idle; starting a new one", w.proc.pid)
        self._replace(k)

    def _failed_start(self, k: int, why: str) -> None:
        self._failed_starts += 1
        if self._failed_starts >= MAX_FAILED_STARTS:
            _stop(self._workers[k])
            self._workers[k] = self._spawn()  # keep the pool whole for a later retry
            raise RuntimeError(
                f"reward verification workers failed to start {self._failed_starts} times in a row "
                f"(last: {why}); check that math-verify imports in this environment"
            )
        log.warning("reward worker failed to start (%s); retrying", why)
        self._replace(k)

    def _enforce_deadlines(self, call: _Call) -> None:
        now = time.monotonic()
        for k, w in enumerate(self._workers):
            if w.seq is not None and now >= w.deadline:
                log.info(
                    "reward item %d took over %.1fs; killing worker %s", w.index, call.timeout_s, w.proc.pid
                )
                call.finish(w.index, "timeout", False)
                w.seq = None
                self._replace(k)
            elif not w.ready and now >= w.started + STARTUP_TIMEOUT_S:
                self._failed_start(k, f"not ready after {STARTUP_TIMEOUT_S:.0f}s")
