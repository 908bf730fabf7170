"""Looking up a variant by its config name, with the error a user should see.

Every variant (question and trajectory selection, rollout engines, losses, aggregations, prompt
templates, data sources) is declared once, in a plain `dict[str, ...]` registry of the module that
owns it: name -> implementation and its capabilities. Nothing else compares a variant by its name;
code asks the registry. `pick` is how builders and the start-up check read a registry, so that an
unknown name stops the run with exit code 2, naming the key and the allowed names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from exgrpo_cli.config.schema import ConfigError

T = TypeVar("T")


def pick(registry: Mapping[str, T], key: str, name: str) -> T:
    """`registry[name]`, or a ConfigError such as `invalid replay.trajectory_selection='x':
    allowed one of lowest_entropy, highest_entropy, ...`."""
    try:
        return registry[name]
    except KeyError:
        raise ConfigError(f"invalid {key}={name!r}: allowed one of {', '.join(registry)}") from None
