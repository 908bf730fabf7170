"""The verification worker: the only code that hands model text to math-verify.

Part of the reward stage of the train step (after rollouts, before the replay buffer update).
`pool.py` starts `worker_main` in fresh "spawn" processes; each one imports math-verify once,
answers one item at a time over its pipe, and calls `parse`/`verify` in its own MAIN thread so
that math-verify's `signal.alarm` timeouts work. Those timeouts are the polite limit (the worker
reports a timeout and lives on); the parent's hard per-item deadline, which kills the process,
is the guarantee. Nothing here evaluates model text itself: math-verify's LaTeX parser builds
sympy objects, and its plain-expression path only accepts digits and operators.

Protocol: the parent sends `(seq, gold, pred, budget_s)` (both answers already prepared by
`extract.prepare_math`) or None to stop; the worker first sends `("ready", pid)` and then one
`(seq, status, correct)` per item, status being "ok", "timeout" or "error".
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections import OrderedDict
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

_GOLD_CACHE_SIZE = 4096


class _Budget:
    """Seconds left for one item, in the whole seconds that `signal.alarm` understands."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s

    def seconds(self) -> int | None:
        left = self.deadline - time.monotonic()
        return None if left <= 0 else max(1, math.floor(left))


class Verifier:
    """math-verify calls with timeouts and a cache of parsed gold answers (the same gold is
    checked against every rollout of its question)."""

    def __init__(self) -> None:
        from math_verify import parse, verify
        from math_verify.errors import TimeoutException

        self._parse: Callable[..., list[Any]] = parse
        self._verify: Callable[..., bool] = verify
        self.timeout_exc: type[BaseException] = TimeoutException
        self._gold: OrderedDict[str, list[Any]] = OrderedDict()

    def _parse_math(self, text: str, budget: _Budget) -> list[Any] | None:
        """Parsed candidates ([] when unparseable), or None on timeout."""
        seconds = budget.seconds()
        if seconds is None:
            return None
        try:
            return self._parse(f"${text}$", parsing_timeout=seconds, raise_on_error=True)
        except self.timeout_exc:
            return None
        except Exception:  # a parser error means "no answer", not a broken worker
            return []

    def _gold_parsed(self, gold: str, budget: _Budget) -> list[Any] | None:
        hit = self._gold.get(gold)
        if hit is not None:
            self._gold.move_to_end(gold)
            return hit
        parsed = self._parse_math(gold, budget)
        if parsed is not None:
            self._gold[gold] = parsed
            if len(self._gold) > _GOLD_CACHE_SIZE:
                self._gold.popitem(last=False)
        return parsed

    def check(self, gold: str, pred: str, budget_s: float) -> tuple[str, bool]:
        """("ok", correct) or ("timeout", False). Pairs of candidates are compared one by one, as
        `verify` does for lists, but with errors raised so that a timeout is told apart."""
        budget = _Budget(budget_s)
        gold_parsed = self._gold_parsed(gold, budget)
        if gold_parsed is None:
            return "timeout", False
        pred_parsed = self._parse_math(pred, budget)
        if pred_parsed is None:
            return "timeout", False
        for g in gold_parsed:
            for p in pred_parsed:
                seconds = budget.seconds()
                if seconds is None:
                    return "timeout", False
                try:
                    if self._verify(g, p, timeout_seconds=seconds, raise_on_error=True):
                        return "ok", True
                except self.timeout_exc:
                    return "timeout", False
                except Exception:  # e.g. a sympy error on one pair: that pair is not equal
                    continue
        return "ok", False


def worker_setup(memory_limit_mb: int | None) -> None:
    """The start of a worker process (this module's and reward/user_function.py's): Ctrl-C is the
    parent's business (it stops us), one OpenMP thread, and the address-space limit if any."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not memory_limit_mb:
        return
    try:
        import resource

        limit = int(memory_limit_mb) * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):  # not available here: the hard timeout still holds
        pass


def worker_main(conn: Connection, memory_limit_mb: int | None) -> None:
    """Entry point of a verification process (see the module docstring for the protocol)."""
    worker_setup(memory_limit_mb)
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    verifier = Verifier()
    verifier.check("1", "1", 5.0)  # warm up the grammar and sympy before reporting ready
    try:
        conn.send(("ready", os.getpid()))
    except OSError:  # the parent is gone already
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if msg is None:
            return
        seq, gold, pred, budget_s = msg
        try:
            status, correct = verifier.check(gold, pred, budget_s)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # MemoryError, RecursionError, a stray alarm: this item only
            status = "timeout" if isinstance(exc, verifier.timeout_exc) else "error"
            correct = False
        try:
            conn.send((seq, status, bool(correct)))
        except (EOFError, OSError):
            return
