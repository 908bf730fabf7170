"""Statistics of a replay buffer as a checkpoint holds it: pure functions, a JSON-able result.

Place: `exgrpo inspect-buffer` loads `<checkpoint>/replay/` with `ExperienceBuffer.load`, reads
`trainer_state.json` and the run's `replay.method` (`run_replay_method`), and calls
`buffer_report`; render.py, plot.py and `--json` only format the dict it returns. Everything is
computed from the buffer's flat arrays (`state_dict()`) with numpy so that a buffer of 100k
experiences is described in well under a second: no per-experience Python objects are built.
Every method's buffer is described: a prompts-only one (questions, no response) and one holding
solutions from elsewhere (no behaviour log-probs) are named as such (`stores`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.persistence import META_LEN, META_STEP

STATS = ("mean", "min", "p10", "median", "p90", "max")  # a distribution's numbers besides its count
MAX_CONFIG_BYTES = 1 << 20  # the run's .hydra/config.yaml, read for its replay.method


class TargetError(ValueError):
    """The path given to inspect-buffer is not a run dir or a checkpoint dir."""


def resolve_checkpoint(target: str) -> Path:
    """A checkpoint dir given itself, a run dir (its latest checkpoint) or a run's checkpoints/ dir."""
    from exgrpo_cli.checkpoint.store import latest_checkpoint

    if not target:
        raise TargetError("give a run dir or a checkpoint dir: exgrpo inspect-buffer <path>")
    path = Path(target).expanduser()
    if not path.exists():
        raise TargetError(f"{path} does not exist")
    if (path / "replay").is_dir() and (path / "trainer_state.json").is_file():
        return path
    for root in (path / "checkpoints", path):
        if root.is_dir():
            found = latest_checkpoint(root)
            if found is not None:
                return found
    if (path / "checkpoints").is_dir() or path.name == "checkpoints":
        raise TargetError(f"{path} holds no complete checkpoint yet")
    raise TargetError(
        f"{path} is neither a run dir (with checkpoints/) nor a checkpoint dir "
        "(with replay/ and trainer_state.json)"
    )


def run_dir_of(checkpoint: Path) -> Path | None:
    """`<run>/checkpoints/step_N` -> `<run>`; None for a checkpoint kept elsewhere."""
    parent = checkpoint.resolve().parent
    return parent.parent if parent.name == "checkpoints" else None


def histogram(values: np.ndarray, bins: int = 10, integer: bool = False) -> dict[str, list]:
    """Counts over equal-width bins spanning [min, max]; integer data gets integer-aligned edges.

    Returns {"edges": bins+1 floats, "counts": bins ints}; empty input gives empty lists.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"edges": [], "counts": []}
    lo, hi = float(v.min()), float(v.max())
    if integer:
        # One bin per value while the range is small, else widths rounded up to whole numbers, so
        # that a length is never split across two bins.
        width = max(1, math.ceil((hi - lo + 1) / bins))
        n = math.ceil((hi - lo + 1) / width)
        edges = lo + width * np.arange(n + 1, dtype=np.float64)
    else:
        if hi == lo:
            lo, hi = lo - 0.5, hi + 0.5
        edges = np.linspace(lo, hi, bins + 1)
    counts, _ = np.histogram(v, bins=edges)
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


def distribution(values: np.ndarray, bins: int = 10, integer: bool = False) -> dict[str, Any]:
    """count, mean, min, p10, median, p90, max and a histogram of `values` (None when empty)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"count": 0, **dict.fromkeys(STATS), "histogram": histogram(v)}
    p10, p50, p90 = np.percentile(v, [10, 50, 90])
    return {
        "count": int(v.size),
        "mean": float(v.mean()),
        "min": float(v.min()),
        "p10": float(p10),
        "median": float(p50),
        "p90": float(p90),
        "max": float(v.max()),
        "histogram": histogram(v, bins, integer),
    }


def segment_means(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Mean of each consecutive segment of `values` (segment i has lengths[i] > 0 items)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return np.zeros(0, dtype=np.float64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    sums = np.add.reduceat(np.asarray(values, dtype=np.float64), starts)
    return sums / lengths


def stored_kind(questions: int, experiences: int, without_logp: int) -> str:
    """What a buffer holds, in words: a method that replays prompts stores questions and no
    response; one that replays other models' solutions stores responses without behaviour log-probs."""
    if not experiences:
        return "prompts only" if questions else "empty"
    if without_logp == experiences:
        return "responses without behaviour log-probs (solutions from elsewhere)"
    if without_logp:
        return "responses, some without behaviour log-probs (solutions from elsewhere)"
    return "responses with behaviour log-probs"


def run_replay_method(checkpoint: Path) -> tuple[str | None, str]:
    """The run's `replay.method` as its `<run>/.hydra/config.yaml` names it, and where that came
    from; (None, why) when it cannot be read. Display only: a method named by a file
    (`path/to/file.py:Name`) is shown, never imported. The file is read as data, size-bounded and
    without following a link; a run from before `replay.method` existed trained ExGRPO."""
    from omegaconf import OmegaConf

    from exgrpo_cli.checkpoint.safe_read import read_regular

    run = run_dir_of(checkpoint)
    saved = run / ".hydra" / "config.yaml" if run is not None else None
    if saved is None or not saved.is_file():
        return None, "unknown (no .hydra/config.yaml beside the checkpoint)"
    try:
        # YAML as data (Hydra saved it unresolved: its interpolations stay text, none resolved)
        loaded = OmegaConf.create(read_regular(saved, MAX_CONFIG_BYTES).decode("utf-8"))
        data = OmegaConf.to_container(loaded, resolve=False)
        if not isinstance(data, dict) or not isinstance(data.get("replay"), dict):
            raise TypeError("no replay section")
        method = data["replay"].get("method", "exgrpo")
        if not isinstance(method, str):
            raise TypeError(f"replay.method is a {type(method).__name__}")
    except Exception as err:  # an edited or foreign file: the buffer is still worth showing
        return None, f"unknown ({saved} could not be read: {str(err)[:200]})"
    return method[:300], str(saved)


def buffer_report(
    buf: ExperienceBuffer, trainer_state: dict | None = None, top: int = 5, bins: int = 10
) -> dict[str, Any]:
    """Everything inspect-buffer prints, as plain data (see render.py for the text view)."""
    state = buf.state_dict()
    arrays, index = state["arrays"], state["index"]
    meta = arrays["meta"]
    lengths = meta[:, META_LEN]
    counts = arrays["experience_counts"]
    qbuckets = np.asarray(index["question_buckets"], dtype=np.int64)
    exp_per_bucket = (
        np.bincount(qbuckets, weights=counts, minlength=buf.num_buckets).astype(np.int64)
        if counts.size
        else np.zeros(buf.num_buckets, dtype=np.int64)
    )
    sizes = buf.bucket_sizes()
    centres = buf.bucket_centres()
    buckets = [
        {
            "bucket": b + 1,
            "accuracy": centres[b],
            "questions": int(sizes[b]),
            "experiences": int(exp_per_bucket[b]),
        }
        for b in range(buf.num_buckets)
    ]
    logp_means = segment_means(arrays["behavior_logp"], lengths)
    # a response that came from elsewhere (another model's solution, a data column) has no
    # behaviour policy here: its log-probs are not finite, and it stays out of their distribution
    without_logp = int(np.count_nonzero(~np.isfinite(logp_means)))
    # Stable sort on -count: ties keep the buffer's insertion order, so the list is deterministic.
    order = np.argsort(-counts, kind="stable")[:top]
    uids = index["questions"]
    tok_ends = np.cumsum(lengths)
    exp_ends = np.cumsum(counts)
    top_questions = []
    for i in order.tolist():
        e0 = int(exp_ends[i] - counts[i])
        # a question with no stored response (a prompts-only method's) has no length to average
        n_tok = int(tok_ends[exp_ends[i] - 1] - (tok_ends[e0 - 1] if e0 else 0)) if counts[i] else 0
        top_questions.append(
            {
                "uid": uids[i],
                "bucket": int(qbuckets[i]) + 1,
                "accuracy": centres[int(qbuckets[i])],
                "experiences": int(counts[i]),
                "mean_length": n_tok / int(counts[i]) if counts[i] else None,
            }
        )
    ts = trainer_state or {}
    step = ts.get("step")
    # steps since collection at the checkpoint's step (0: collected by that step); unknown without
    # trainer_state.json. A replayed row is one step older still, when the next step replays it.
    known = isinstance(step, int) and not isinstance(step, bool)
    ages = step - meta[:, META_STEP] if known else np.zeros(0, dtype=np.int64)
    return {
        "step": ts.get("step"),
        "delayed_start": ts.get("delayed_start"),
        "group_size": buf.group_size,
        "bucket_by": buf.bucket_by,  # what "accuracy" measures: k/K (count) or normalised std (reward_std)
        "questions": buf.num_questions,
        "experiences": buf.num_experiences,
        "retired": len(index["retired"]),
        "pending_retire": len(index["pending_retire"]),
        "stores": stored_kind(buf.num_questions, buf.num_experiences, without_logp),
        "without_behavior_logp": without_logp,
        "stored_tokens": buf.stored_tokens,
        "megabytes": buf.nbytes / 2**20,
        "buckets": buckets,
        "response_length": distribution(lengths, bins, integer=True),
        "behavior_logp_mean": distribution(logp_means[np.isfinite(logp_means)], bins),
        "collected_at_step": distribution(meta[:, META_STEP], bins, integer=True),
        "age": distribution(ages, bins, integer=True),
        "max_age": buf.max_age,  # replay.max_age of the run (0: no limit)
        "expired": int(index.get("expired", 0)),  # dropped for their age so far
        "top_questions": top_questions,
        # what the run's method keeps per question (replay/methods.py): entries per record
        "method_state": {
            k: len(v) if isinstance(v, (dict, list)) else v for k, v in buf.method_state.items()
        },
    }
