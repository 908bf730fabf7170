"""`reward=python`: the user's reward function, run in a worker process under a time budget.

Part of the reward stage of the train step (after rollouts, before the replay buffer update). The
function is named by `reward.function`, `path/to/file.py:name` or `package.module:name`, and is
called in TRL's convention with one rank's share of the step's responses:

    fn(completions, prompts=..., answers=..., <every data column>=...) -> list of float | None

`completions` are the decoded response texts, `prompts` the questions' texts, `answers` their gold
answers ("" where the data has none), and every column of the data rows arrives under its own
name (one value per completion; None where a row lacks it). A column named completions, prompts or
answers is shadowed by ours. None in the returned list means "not scored": it trains as 0 and is
counted in `reward/unscored`.

Isolation: the function runs in its own "spawn" process (one per rank, with an address-space cap),
one call at a time; a call that does not answer within `reward.timeout_s` gets its process killed
and replaced. A call that raises, or returns something other than one finite number (or None) per
completion, scores all of its items 0 and counts them as errors; the first traceback is logged
once. The project never executes model output: a function that does is the user's to sandbox.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import numbers
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from exgrpo_cli.config.schema import ConfigError
from exgrpo_cli.config.user_code import load_named
from exgrpo_cli.data.types import Question, answer_only_questions
from exgrpo_cli.reward.scorer import ScoreResult
from exgrpo_cli.reward.verify import worker_setup

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 120.0


def load_function(spec: str) -> Callable[..., Any]:
    """The callable `spec` names (`file.py:name` or `module:name`); ConfigError (exit 2) with one
    line when the file or module does not import or the name is absent or not callable."""
    fn = load_named(spec, "reward.function")
    if not callable(fn):
        name = spec.rpartition(":")[2]
        raise ConfigError(f"invalid reward.function={spec!r}: {name} is a {type(fn).__name__}, not callable")
    return fn  # type: ignore[no-any-return]


def call_arguments(texts: Sequence[str], questions: Sequence[Question]) -> dict[str, list[Any]]:
    """The keyword arguments of one call: every data column (the union over the rows), then our
    three names (which win over columns of the same name)."""
    names: dict[str, None] = {}
    for q in questions:
        names.update(dict.fromkeys(q.columns))
    kwargs: dict[str, list[Any]] = {n: [q.columns.get(n) for q in questions] for n in names}
    kwargs["prompts"] = [q.question for q in questions]
    kwargs["answers"] = [q.answer for q in questions]
    kwargs["completions"] = list(texts)
    return kwargs


def check_output(out: Any, n: int) -> list[float | None]:
    """The function's return value as n rewards (None: not scored), or ValueError saying why not."""
    if isinstance(out, str | bytes) or not isinstance(out, Sequence) and not hasattr(out, "tolist"):
        raise ValueError(f"returned a {type(out).__name__}, not a list of {n} numbers")
    values = list(out.tolist() if hasattr(out, "tolist") else out)
    if len(values) != n:
        raise ValueError(f"returned {len(values)} values for {n} completions")
    rewards: list[float | None] = []
    for i, v in enumerate(values):
        if v is None:
            rewards.append(None)
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ValueError(f"value {i} is a {type(v).__name__}, not a number")
        if not math.isfinite(float(v)):
            raise ValueError(f"value {i} is {float(v)}, not a finite number")
        rewards.append(float(v))
    return rewards


def worker_main(conn: Connection, spec: str, memory_limit_mb: int | None) -> None:
    """A reward-function process: load `spec`, say ("ready",) or ("failed", why), then answer each
    (seq, completions, kwargs) with (seq, "ok", rewards) or (seq, "error", traceback)."""
    worker_setup(memory_limit_mb)
    try:
        fn = load_function(spec)
        conn.send(("ready",))
    except BaseException as err:
        conn.send(("failed", str(err)))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        seq, kwargs = msg
        try:
            reply: tuple[Any, ...] = (seq, "ok", check_output(fn(**kwargs), len(kwargs["completions"])))
        except BaseException:  # the user's code: whatever it raises scores this call 0
            reply = (seq, "error", traceback.format_exc(limit=8))
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return


class FunctionReward:
    """Scores with the user's function in a worker process; `score` has `RewardScorer`'s shape."""

    def __init__(self, spec: str, timeout_s: float, memory_limit_mb: int = 0) -> None:
        self.spec, self.timeout_s, self.memory_limit_mb = spec, float(timeout_s), memory_limit_mb or None
        self._ctx = mp.get_context("spawn")
        self._seq = 0
        self.first_error = ""  # the first failure's message (its traceback is logged once)
        self._totals = {"reward/timeouts": 0, "reward/errors": 0, "reward/unscored": 0}
        self._proc: Any = None
        self._conn: Connection | None = None
        self._start()

    def _start(self) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        self._proc = self._ctx.Process(
            target=worker_main,
            args=(child, self.spec, self.memory_limit_mb),
            daemon=True,
            name="exgrpo-reward-fn",
        )
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(_START_TIMEOUT_S):
            raise RuntimeError(
                f"reward.function={self.spec}: its worker did not start in {_START_TIMEOUT_S:.0f}s"
            )
        msg = parent.recv()
        if msg[0] != "ready":
            raise ConfigError(str(msg[1]))

    def _kill(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5.0)
            self._proc = None

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass
        self._kill()

    def metrics(self) -> dict[str, int]:
        return dict(self._totals)

    def _fail(self, what: str, detail: str) -> None:
        if not self.first_error:
            self.first_error = what
            log.error("reward.function=%s %s\n%s", self.spec, what, detail)
            print(f"exgrpo: reward.function={self.spec} {what} (traceback in the run's log)", file=sys.stderr)

    def _call(self, kwargs: dict[str, list[Any]]) -> tuple[str, Any]:
        """("ok", rewards) | ("error", traceback) | ("timeout", None) of one call."""
        if self._conn is None:
            self._start()
        assert self._conn is not None
        self._seq += 1
        self._conn.send((self._seq, kwargs))
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                ready = left > 0 and self._conn.poll(left)
                if not ready:
                    self._kill()
                    return "timeout", None
                seq, status, payload = self._conn.recv()
            except (EOFError, OSError):
                code = self._proc.exitcode if self._proc is not None else None
                self._kill()
                return "error", f"its worker process died (exit code {code}; out of memory?)"
            if seq == self._seq:
                return status, payload

    def score(
        self,
        responses: Sequence[str],
        answers: Sequence[str],
        kinds: Any = None,
        *,
        rules: Any = None,
        questions: Sequence[Question] | None = None,
    ) -> ScoreResult:
        n = len(responses)
        if questions is None:  # a caller with answers only: the questions carry nothing else
            questions = answer_only_questions(answers)
        if n == 0:
            return ScoreResult(rewards=[], extracted=[])
        status, payload = self._call(call_arguments(responses, questions))
        result = ScoreResult(rewards=[0.0] * n, extracted=[None] * n)
        if status == "timeout":
            result.timeouts = n
            self._fail(f"ran past reward.timeout_s={self.timeout_s:g}s", "")
        elif status == "error":
            result.errors = n
            self._fail(f"failed: {payload.strip().splitlines()[-1]}", payload)
        else:
            result.rewards = [0.0 if r is None else r for r in payload]
            result.unscored = sum(r is None for r in payload)
        for key in ("timeouts", "errors", "unscored"):
            self._totals[f"reward/{key}"] += getattr(result, key)
        return result
