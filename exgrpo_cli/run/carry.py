"""`replay.init_from`: a new run that starts with another run's replay buffer (RLEP's second phase,
continual RL from a strong start). Only the buffer is carried: model, optimizer, sampler, RNGs and
step counter are the new run's own.

Where it sits: once, before the first step and before any weights load. run/training.py reads the
buffer before the run dir is locked or written (`early_read`), so a refusal leaves nothing behind;
run/setup.py makes it the fresh run's buffer (`start_buffer`). A resumed run never reads it again:
its own checkpoint holds its buffer (carried entries included).

Trust: the other run is data. Its checkpoint must verify (checkpoint/store.py's manifest of
SHA-256s) for the files read here, `replay/` and the tokenizer's `tokenizer.json`; the buffer is
read by replay/persistence.py (safetensors + size-bounded JSON, no pickle); nothing of the old
run's config is read. What must match is compared as data:
- the group size (rollout.n) and the bucket rule (replay.bucket_by, replay.bucket_edges), which
  give a stored question's bucket its meaning;
- the tokenizer, by its vocabulary: the (token, id) pairs, added tokens included, of the old
  checkpoint's own `tokenizer.json` (parsed by the `tokenizers` library's JSON reader, which runs
  no code) against this run's tokenizer's `get_vocab()`. Stored responses are token ids: the same
  vocabulary is what makes them the same text. File hashes would refuse a tokenizer that
  `save_pretrained` merely re-serialised.

Carried entries (docs/replay-buffer.md "Starting from another run's buffer"): their collection steps
count as step 0 of the new run (the other run's step numbers mean nothing here), so their age at
step s is s and `replay.max_age` counts from the new run's start; questions the new run's training
data lacks are dropped (a replayed question needs its prompt); the retired set and the run
counters (re-admitted, expired) stay with the old run: retirement judged the old policy. Of the old
run's replay-method state (`method_state`) the new run's method keeps what its `carried` hook
says (none by default: reuse counts and replay steps were the old run's; RePO keeps its stored
rewards), and its `replays` hook refuses a content it cannot replay: a buffer of prompts only
(replay.method=prompt, prioritized) for a method that replays stored responses, incorrect
responses (repo) for one that replays them as correct, no reward record for repo's `reward`
retrieval.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exgrpo_cli.checkpoint import safe_read
from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.errors import UsageError
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.method_registry import build_replay_method
from exgrpo_cli.replay.persistence import META_STEP, load_buffer

log = logging.getLogger(__name__)

KEY = "replay.init_from"
TOKENIZER_FILES = ("model/tokenizer.json", "adapter/tokenizer.json")  # adapter/: a model.lora run
MAX_TOKENIZER_BYTES = 64 * 2**20  # Qwen2.5's tokenizer.json is 7 MB


class InitFromRefused(UsageError):
    """replay.init_from names a buffer this run cannot start with; nothing was created."""


def _refuse(target: str, why: str) -> InitFromRefused:
    return InitFromRefused(f"{KEY}={target}: {why}")


@dataclass(frozen=True)
class CarriedBuffer:
    checkpoint: Path  # the verified checkpoint the buffer was read from
    buffer: ExperienceBuffer  # with this run's settings: the old entries, at step 0, nothing retired


def starts_fresh(cfg: ExgrpoConfig) -> bool:
    """Whether this run will start from step 0, as run/resume.py's `decide_resume` will decide
    (read-only here): resume=never, or auto in a dir without a complete checkpoint. (auto over
    checkpoints that all fail to verify or load refuses rather than starting fresh.)"""
    r = cfg.trainer.resume
    if r == "never":
        return True
    return r == "auto" and ckpt.latest_checkpoint(Path(cfg.trainer.output_dir) / "checkpoints") is None


def resolve(target: str) -> tuple[Path, list[str]]:
    """The checkpoint `target` names and warnings: a checkpoint dir itself (it must verify), or a
    run dir / its checkpoints/ dir, meaning its newest checkpoint whose buffer verifies (newer ones
    that do not are named in a warning, and left as they are: another run's dir is never changed)."""
    path = Path(target).expanduser()
    if not path.is_dir():
        raise _refuse(target, "no such folder (give a run dir or a checkpoint dir)")
    if (path / ckpt.COMPLETE).is_file():
        reason = _verify(path)
        if reason:
            raise _refuse(target, f"the checkpoint does not verify, nothing of it is read: {reason}")
        return path, []
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    warnings: list[str] = []
    for folder in ckpt.resume_candidates(root):
        reason = _verify(folder)
        if reason is None:
            return folder, warnings
        warnings.append(f"{KEY}: checkpoint {folder.name} does not verify ({reason}); using an older one")
    if warnings:
        raise _refuse(target, f"no checkpoint of it verifies ({'; '.join(warnings)})")
    raise _refuse(target, "neither a checkpoint dir (with COMPLETE) nor a run dir with a complete checkpoint")


def _verify(folder: Path) -> str | None:
    """The first problem with the files read here, else None (the weights are not hashed)."""
    for prefix in ("replay/", *TOKENIZER_FILES):
        reason = ckpt.verify(folder, prefix=prefix)
        if reason:
            return reason
    return None


def vocab_digest(vocab: dict[str, int]) -> str:
    """A digest of a vocabulary: its (token, id) pairs in id order."""
    pairs = sorted(vocab.items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.blake2b(json.dumps(pairs, ensure_ascii=False).encode(), digest_size=16).hexdigest()


def saved_vocab(folder: Path, target: str) -> dict[str, int]:
    """The vocabulary of checkpoint `folder`'s tokenizer.json, read as data."""
    from tokenizers import Tokenizer

    for name in TOKENIZER_FILES:
        path = folder / name
        if path.is_file():
            try:
                raw = safe_read.read_regular(path, MAX_TOKENIZER_BYTES).decode("utf-8")
                return dict(Tokenizer.from_str(raw).get_vocab(with_added_tokens=True))
            except Exception as err:  # noqa: BLE001 - whatever a crafted file trips, as one line
                raise _refuse(target, f"{path} is not a tokenizer: {str(err)[:200]}") from None
    raise _refuse(
        target,
        f"{folder} holds no tokenizer.json (model/ or adapter/), so its token ids cannot be checked "
        "against this run's tokenizer",
    )


def read_init_from(cfg: ExgrpoConfig, tokenizer: Any) -> CarriedBuffer:
    """Resolve, verify and read `replay.init_from`, refusing (InitFromRefused, one line, exit 2)
    a buffer whose group size, bucket rule or tokenizer differs from this run's."""
    target, p = cfg.replay.init_from, cfg.replay
    folder, warnings = resolve(target)
    for w in warnings:
        log.warning(w)
    try:
        state = load_buffer(str(folder / "replay"))
        index = state["index"]
        size, rule = index["group_size"], index.get("bucket_by", "count")
    except Exception as err:  # noqa: BLE001 - a crafted buffer: refused, never a traceback
        raise _refuse(target, f"{folder / 'replay'} is not a readable buffer: {str(err)[:200]}") from None
    if size != cfg.rollout.n:
        raise _refuse(
            target, f"its buffer holds groups of {size} responses, this run has rollout.n={cfg.rollout.n}"
        )
    if rule != p.bucket_by:
        raise _refuse(
            target, f"its buffer is bucketed by {str(rule)[:20]}, this run has replay.bucket_by={p.bucket_by}"
        )
    try:  # the edges and the arrays' consistency, as a resume checks them
        buffer = carried_buffer(state, _fresh_buffer(cfg))
    except Exception as err:  # noqa: BLE001
        raise _refuse(target, f"{str(err)[:240]}") from None
    # what this run's method keeps of the other run's state, and whether it can replay the content
    method = build_replay_method(cfg)
    buffer.method_state = method.carried(buffer.method_state)
    reason = method.replays(buffer)
    if reason:
        raise _refuse(target, f"replay.method={cfg.replay.method} cannot start with its buffer: {reason}")
    if vocab_digest(saved_vocab(folder, target)) != vocab_digest(dict(tokenizer.get_vocab())):
        raise _refuse(
            target,
            f"its tokenizer's vocabulary differs from this run's (model.path={cfg.model.path}): "
            "its stored token ids would be other text",
        )
    return CarriedBuffer(folder, buffer)


def early_read(cfg: ExgrpoConfig) -> CarriedBuffer | None:
    """`read_init_from` before the run dir is touched, for a run that starts fresh (None else, or
    without replay.init_from), with this run's own tokenizer (loaded alone, no weights)."""
    if not cfg.replay.init_from or not starts_fresh(cfg):
        return None
    from exgrpo_cli.policy.model import load_tokenizer

    return read_init_from(cfg, load_tokenizer(cfg.model))


def _fresh_buffer(cfg: ExgrpoConfig) -> ExperienceBuffer:
    p = cfg.replay
    return ExperienceBuffer(cfg.rollout.n, p.bucket_edges, p.max_experiences, p.bucket_by, p.max_age)


def carried_buffer(state: dict[str, Any], fresh: ExperienceBuffer) -> ExperienceBuffer:
    """`fresh` (empty, this run's settings) filled with a saved buffer `state`: its questions, bucket
    places and experiences, collected "at step 0", without the old run's retired set and counters.
    ValueError when the state does not fit (bucket edges) or does not hold together."""
    arrays = dict(state["arrays"])
    meta = np.array(arrays["meta"], dtype=np.int64).reshape(-1, 4)
    meta[:, META_STEP] = 0  # collected "before step 1" of this run: ages count from its start
    arrays["meta"] = meta
    index = dict(state["index"], retired=[], pending_retire=[], readmitted=0, expired=0)
    fresh.load_state_dict({"arrays": arrays, "index": index})
    return fresh


def carried_questions(carried: CarriedBuffer, uids: set[str]) -> tuple[list[str], list[str]]:
    """(kept, dropped): the carried questions this run's training data has, and the others."""
    buf = carried.buffer
    questions = [u for b in range(buf.num_buckets) for u in buf.questions_in_bucket(b)]
    return [u for u in questions if u in uids], [u for u in questions if u not in uids]


def start_buffer(carried: CarriedBuffer, uids: set[str]) -> str:
    """Leave out of the carried buffer the questions not in `uids` (the training data's), making it
    the fresh run's; returns a line saying what came."""
    buffer = carried.buffer
    _, dropped = carried_questions(carried, uids)
    for uid in dropped:
        buffer.discard(uid)
    line = (
        f"{KEY}: started with the buffer of {carried.checkpoint}: {buffer.num_questions} questions, "
        f"{buffer.num_experiences} experiences"
    )
    if dropped:
        line += f" ({len(dropped)} more questions are not in this run's training data: left out)"
    return line
