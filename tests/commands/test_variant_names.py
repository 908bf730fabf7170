"""The names a registry key may take are generated from the registries (commands/variants.py):
config/variant_names.py is current, every such key's help lists exactly its registry's names, and
the start-up check refuses a name for each key of the table."""

from __future__ import annotations

import dataclasses

import pytest

from exgrpo_cli.commands.variants import check_variants, main, registries, render_names
from exgrpo_cli.config import keys as schema_keys
from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig
from exgrpo_cli.config.variant_names import NAMES


def test_the_generated_names_are_current() -> None:
    assert main([]) == 0, "stale: python -m exgrpo_cli.commands.variants --write"
    assert NAMES == {key: tuple(registry) for key, registry in registries().items()}


def test_a_stale_names_file_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    import exgrpo_cli.commands.variants as variants

    monkeypatch.setattr(variants, "render_names", lambda: render_names() + "# one more line\n")
    assert main([]) == 1


def test_every_registry_key_is_a_schema_key_whose_help_lists_its_names() -> None:
    declared = {k.name: k for k in schema_keys.keys()}
    for key, registry in registries().items():
        assert key in declared, key
        assert declared[key].help.endswith(": " + " | ".join(registry)), declared[key].help


def _with(cfg: ExgrpoConfig, key: str, value: str) -> ExgrpoConfig:
    section, _, rest = key.partition(".")
    if "." in rest:  # one level deeper: reward.model.normalise
        sub, _, leaf = rest.partition(".")
        inner = getattr(getattr(cfg, section), sub)
        new_section = dataclasses.replace(
            getattr(cfg, section), **{sub: dataclasses.replace(inner, **{leaf: value})}
        )
    else:
        new_section = dataclasses.replace(getattr(cfg, section), **{rest: value})
    return dataclasses.replace(cfg, **{section: new_section})


@pytest.mark.parametrize("key", sorted(registries()))
def test_the_start_up_check_refuses_an_unknown_name_of_each_key(key: str) -> None:
    cfg = ExgrpoConfig()
    if key == "reward.model.normalise":  # read only when the reward is a model
        cfg = _with(_with(cfg, "reward.kind", "model"), "reward.model.path", "some/hub-id")
    command = "eval" if key == "eval.suite" else "train"
    check_variants(cfg, command)  # the defaults pass
    with pytest.raises(ConfigError, match=rf"invalid {key}='nope'"):
        check_variants(_with(cfg, key, "nope"), command)
