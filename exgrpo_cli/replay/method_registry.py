"""The registry of replay methods (`replay.method`) and the builder the trainer and the start-up
check share: a name of REPLAY_METHODS, or a user's class from `path/to/file.py:Name`.

Where it sits: at start-up (commands/variants.py builds the method once, so that a wrong name or a
broken file is one line and exit code 2 before any model loads) and when the trainer is built
(run/setup.py). The hooks a method has are replay/methods.py's protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exgrpo_cli.config.schema import ConfigError
from exgrpo_cli.config.user_code import load_named
from exgrpo_cli.replay.luffy import LuffyReplay
from exgrpo_cli.replay.methods import HOOKS, ExgrpoReplay, ReplayMethod
from exgrpo_cli.replay.prioritized_replay import PrioritizedReplay
from exgrpo_cli.replay.prompt_replay import PromptReplay
from exgrpo_cli.replay.repo import RepoReplay
from exgrpo_cli.replay.rlep import RlepReplay

# `replay.method`: name -> (the run's config.ExgrpoConfig, duck-typed) -> the method.
REPLAY_METHODS: dict[str, Callable[[Any], ReplayMethod]] = {
    "exgrpo": ExgrpoReplay,
    "prompt": PromptReplay,
    "prioritized": PrioritizedReplay,
    "rlep": RlepReplay,
    "repo": RepoReplay,
    "luffy": LuffyReplay,
}


def is_file_spec(spec: str) -> bool:
    """`path/to/file.py:Name` (or `package.module:Name`) rather than a registry name."""
    return ":" in spec


def build_replay_method(cfg: Any) -> ReplayMethod:
    """The method `replay.method` names, built with the run's config: a REPLAY_METHODS entry, or a
    user's class (or factory) from `path/to/file.py:Name`. ConfigError, one line, for an unknown
    name, a file that does not load, or an object without the protocol's hooks."""
    spec = cfg.replay.method
    if not is_file_spec(spec):
        if spec not in REPLAY_METHODS:
            raise ConfigError(
                f"invalid replay.method={spec!r}: allowed one of {', '.join(REPLAY_METHODS)} "
                "or path/to/file.py:Name"
            )
        return REPLAY_METHODS[spec](cfg)
    factory = load_named(spec, "replay.method")
    if not callable(factory):
        raise ConfigError(f"invalid replay.method={spec!r}: {type(factory).__name__} is not callable")
    try:
        method = factory(cfg)
    except ConfigError:
        raise
    except Exception as err:  # the user's constructor: its failure is a refusal, not a traceback
        raise ConfigError(
            f"invalid replay.method={spec!r}: building it failed ({type(err).__name__}: {err})"
        ) from None
    missing = [h for h in HOOKS if not callable(getattr(method, h, None))]
    missing += [a for a in ("score", "keeps_prompts", "stores_any") if not hasattr(method, a)]
    if missing:
        raise ConfigError(
            f"invalid replay.method={spec!r}: it lacks {', '.join(missing)} "
            "(subclass exgrpo_cli.replay.methods.ExgrpoReplay)"
        )
    return method  # type: ignore[no-any-return]
