"""Resume says what changed: the command's config against the one the checkpoint was trained with.

Where it sits: at the start of `exgrpo train`, once run/resume.py's `decide_resume` has chosen the
checkpoint to resume and before the logger, the tracker or the model start. A resume trains on the
command's config (a run dir is data, never a source of settings), so a resume with a shorter
command than the run's first one would silently continue on another objective (the default math
reward instead of the run's `reward=python`). Each checkpoint holds the config it was trained with
(`config.json`, written by step/state.py with the checkpoint and covered by its checksums); here
it is read as JSON through checkpoint/safe_read (size-bounded, regular file only, never executed)
and compared key by key within the sections that decide what is trained: a key is a schema field
(config/keys.py), so a mapping of the user's own keys (reward.components) is compared whole, and
only a key the checkpoint's config lacks (added to exgrpo since) is skipped. A difference is refused
in one line naming every differing key, unless `trainer.resume_changes=true` confirms it. The
sections that cannot change the objective (trainer: steps, saving, eval cadence; logger; eval)
are never compared, and neither are the keys below that only decide speed or memory. A SLURM
requeue repeats the same command: nothing differs, the resume goes on as before.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from exgrpo_cli.checkpoint.safe_read import UnsafeFile, read_json
from exgrpo_cli.checkpoint.store import CheckpointLoadError, ResumeRefused
from exgrpo_cli.config.keys import sections as schema_sections
from exgrpo_cli.config.schema import ExgrpoConfig

CONFIG_FILE = "config.json"
# the sections whose keys change what is trained
OBJECTIVE_SECTIONS = ("reward", "replay", "algo", "model", "data", "rollout")
# keys inside them that decide only speed, memory or where a part runs, or that a resume never reads
SPEED_OR_MEMORY = frozenset(
    {
        "reward.model.device",
        "reward.model.batch_size",
        "reward.memory_limit_mb",
        "replay.entropy_batch_size",
        "algo.micro_batch_tokens",
        "model.attn_implementation",
        "model.gradient_checkpointing",
        "rollout.gpu_memory_utilization",
        "rollout.enforce_eager",
        "rollout.sleep_mode",
        "rollout.tensor_parallel_size",
        "rollout.validation_sleep_level",
        "data.val_path",
        "data.val_size",
        # read only by a fresh start: a resume continues its own buffer and never reads it again
        "replay.init_from",
    }
)
MAX_LISTED = 12


def trained_with(cfg: ExgrpoConfig) -> dict[str, Any]:
    """What a checkpoint records of its config: the objective's sections, as plain JSON data."""
    whole = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    return {name: whole[name] for name in OBJECTIVE_SECTIONS}


def _flat(prefix: str, value: Any, out: dict[str, Any], sections: frozenset[str]) -> dict[str, Any]:
    """`value` as dotted keys: a schema section is opened key by key, anything else is one value,
    a mapping of the user's own keys (reward.components) compared whole."""
    if prefix in sections and isinstance(value, dict):
        for key, inner in value.items():
            _flat(f"{prefix}.{key}", inner, out, sections)
    else:
        out[prefix] = value
    return out


def _shown(value: Any) -> str:
    """A value from either side, short and on one line (the checkpoint's is someone else's text)."""
    text = json.dumps(value, ensure_ascii=True) if not isinstance(value, str) else value
    text = text.encode("ascii", "backslashreplace").decode().replace("\n", "\\n")
    return text if len(text) <= 40 else text[:37] + "..."


def changes(saved: dict[str, Any], command: dict[str, Any]) -> list[str]:
    """`key: <checkpoint's> -> <command's>` for every key of both that differs, in key order."""
    sections = frozenset(name for name, _, _ in schema_sections())
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    for name in OBJECTIVE_SECTIONS:
        if isinstance(saved.get(name), dict):
            _flat(name, saved[name], before, sections)
        _flat(name, command[name], after, sections)
    # a key on one side only is not compared: one added to exgrpo since the checkpoint was written
    # (or removed since) says nothing about what the run trained with. A key is a schema field:
    # a dict-valued one is one key, so {math: 1, choice: 0.5} against {} or {math: 1} differs
    out = []
    for key in sorted(set(before) & set(after)):
        if key in SPEED_OR_MEMORY or not key.startswith(OBJECTIVE_SECTIONS):
            continue
        if before[key] != after[key]:
            out.append(f"{key}: {_shown(before[key])} -> {_shown(after[key])}")
    return out


def check_resume_changes(cfg: ExgrpoConfig, folder: Path) -> str | None:
    """Refuse (ResumeRefused, one line) a resume from `folder` whose objective's keys differ from
    the command's, unless trainer.resume_changes; returns a warning line when they differ and were
    confirmed, or when the checkpoint records no config (written before configs were kept)."""
    path = folder / CONFIG_FILE
    if not path.exists() and not path.is_symlink():
        return f"{folder} records no config (written before checkpoints kept theirs): not compared"
    try:
        saved = read_json(path)
    except (UnsafeFile, ValueError) as err:  # it verified: a crafted file, quarantined under resume=auto
        raise CheckpointLoadError(
            f"{path} cannot be read as the checkpoint's config: {str(err)[:200]}"
        ) from None
    if not isinstance(saved, dict):
        raise CheckpointLoadError(f"{path} is not a mapping of config sections")
    found = changes(saved, trained_with(cfg))
    if not found:
        return None
    listed = "; ".join(found[:MAX_LISTED]) + (
        f"; and {len(found) - MAX_LISTED} more" if len(found) > MAX_LISTED else ""
    )
    if not cfg.trainer.resume_changes:
        raise ResumeRefused(
            f"this command trains otherwise than {folder} was trained ({listed}): repeat the run's "
            "own settings to resume it, or set trainer.resume_changes=true to continue with these"
        )
    return f"trainer.resume_changes=true: resuming {folder} with {listed}"
