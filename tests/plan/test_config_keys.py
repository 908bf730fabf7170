"""The plan's config keys are validated at start-up, with the key named (exit 2)."""

from __future__ import annotations

import pytest

from exgrpo_cli.commands.variants import check_variants
from exgrpo_cli.config.checks import parse_plan_devices, validate
from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig


@pytest.mark.parametrize(
    ("value", "parsed"), [("8x80", (8, 80.0)), ("1X79.6", (1, 79.6)), (" 2 x 24 ", (2, 24.0))]
)
def test_plan_devices_parse(value: str, parsed: tuple[int, float]) -> None:
    assert parse_plan_devices(value) == parsed


@pytest.mark.parametrize(
    ("dry_run", "value", "error"),
    [(True, v, "trainer.plan_devices") for v in ["8", "0x80", "8x0", "x80", "8x80GB", "eight"]]
    + [(False, "8x80", "only with trainer.dry_run=true")],  # a good value, without a dry run
)
def test_bad_plan_devices_are_refused(dry_run: bool, value: str, error: str) -> None:
    cfg = ExgrpoConfig()
    cfg.trainer.dry_run, cfg.trainer.plan_devices = dry_run, value
    with pytest.raises(ConfigError, match=error):
        validate(cfg)


def test_offload_names() -> None:
    cfg = ExgrpoConfig()
    cfg.trainer.offload = "cpu"
    with pytest.raises(ConfigError, match="trainer.offload='cpu': allowed one of none, optimizer, all"):
        check_variants(cfg, "train")  # the names come from policy.placement.OFFLOAD_MODES


def test_architecture_numbers_come_complete() -> None:
    cfg = ExgrpoConfig()
    cfg.model.arch.hidden_size = 64
    with pytest.raises(ConfigError, match="model.arch.intermediate_size=0"):
        validate(cfg)
    a = cfg.model.arch
    a.intermediate_size, a.num_hidden_layers, a.num_attention_heads, a.vocab_size = 128, 2, 4, 100
    a.num_key_value_heads = 3
    with pytest.raises(ConfigError, match="a divisor of model.arch.num_attention_heads=4"):
        validate(cfg)
    a.num_key_value_heads = 2
    validate(cfg)
