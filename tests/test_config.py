"""Every YAML preset composes against the schema; bad values are refused with the key named."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from exgrpo_cli.commands.variants import check_variants
from exgrpo_cli.config.checks import validate
from exgrpo_cli.config.paths import config_dir
from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig
from exgrpo_cli.policy.packaged import missing_requirement

from conftest import compose_train

CONF = Path(config_dir())


def check(cfg: ExgrpoConfig) -> None:
    """What `exgrpo train` checks before it loads anything: ranges, then the variants' names."""
    validate(cfg)
    check_variants(cfg, "train")


# the groups a user chooses from (recipe/ holds the files the GPU model presets pull in)
GROUPS = sorted(
    p.name for p in CONF.iterdir() if p.is_dir() and not p.name.startswith("_") and p.name != "recipe"
)


def _presets() -> Iterator[tuple[str, str]]:
    for group in GROUPS:
        for f in sorted((CONF / group).glob("*.yaml")):
            yield group, f.stem


@pytest.mark.parametrize("group,preset", list(_presets()))
def test_every_preset_composes_and_validates(group: str, preset: str):
    cfg = compose_train([f"{group}={preset}"])
    assert isinstance(cfg, ExgrpoConfig)
    if group == "model":
        assert cfg.model.preset == preset
    if group == "model" and missing_requirement(cfg.model.path, cfg.model.gguf_file):
        # e.g. smollm2-135m outside `make install`: refused up front, with the install command
        with pytest.raises(ConfigError, match="make install"):
            check(cfg)
    elif group in ("model", "replay", "algo", "rollout", "logger"):
        check(cfg)


def test_defaults_are_the_embedded_cpu_run():
    cfg = compose_train([])
    assert cfg.model.path == "builtin:tiny" and cfg.data.source == "synthetic"
    assert cfg.rollout.engine == "hf" and cfg.model.dtype == "float32"
    assert cfg.replay.ratio == 0.5 and cfg.replay.beta == 0.1 and cfg.replay.start_threshold == 0.35
    check(cfg)


def test_replay_none_is_on_policy():
    assert compose_train(["replay=none"]).replay.ratio == 0.0


@pytest.mark.parametrize(
    "override,key",
    [
        ("replay.ratio=1.5", "replay.ratio"),
        ("replay.ratio=-0.1", "replay.ratio"),
        ("replay.beta=-1", "replay.beta"),
        ("replay.beta=inf", "replay.beta"),  # every replayed token's f(w) = 0 (issue 46)
        ("reward.timeout_s=inf", "reward.timeout_s"),  # a hung reward function never killed
        ("replay.sigma=0", "replay.sigma"),
        ("replay.bucket_edges=[0.5,0.25]", "replay.bucket_edges"),
        ("replay.bucket_edges=[0.0,0.5]", "replay.bucket_edges"),
        ("replay.bucket_edges=[0.5,1.2]", "replay.bucket_edges"),
        ("replay.trajectory_selection=best", "replay.trajectory_selection"),
        ("rollout.n=1", "rollout.n"),
        ("trainer.steps=0", "trainer.steps"),
        ("data.source=jsonl", "data.path"),
        ("data.source=parquet data.path=/nonexistent.parquet", "data.path"),
        ("model.path=/nonexistent/model", "model.path"),
        ("model.template=nope", "model.template"),
        ("algo.lr=0", "algo.lr"),
        ("trainer.fsdp_mixed_precision=fp8", "trainer.fsdp_mixed_precision"),
        ("rollout.n=4 replay.experience_rbound=7", "replay.experience_rbound"),  # above K - 1
        ("replay.experience_lbound=3 replay.experience_rbound=3", "replay.experience_rbound"),
        ("rollout.gpu_memory_utilization=1.5", "rollout.gpu_memory_utilization"),
        ("eval.batch_size=0", "eval.batch_size"),
        ("replay.max_age=-1", "replay.max_age"),
        ("rollout.warn_logprob_diff=0", "rollout.warn_logprob_diff"),
        ("rollout.logprob_diff_trend_window=-1", "rollout.logprob_diff_trend_window"),
        ("algo.rollout_correction.mode=product", "algo.rollout_correction.mode"),
        (
            "algo.rollout_correction.mode=token_tis algo.rollout_correction.cap=0.5",
            "algo.rollout_correction.cap",
        ),
        (
            "algo.rollout_correction.mode=geo_mask algo.rollout_correction.low=1.0",
            "algo.rollout_correction.low",
        ),
        ("algo.rollout_correction.mode=token_tis rollout.top_p=0.9", "rollout.top_p"),
    ],
)
def test_invalid_values_name_the_key(override: str, key: str):
    cfg = compose_train(override.split())
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check(cfg)


def test_model_path_that_is_not_a_causal_lm(tmp_path: Path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="model.path"):
        check(compose_train([f"model.path={tmp_path}"]))


def test_schema_rejects_wrong_types_and_unknown_keys():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose_train(["replay.ratio=abc"])
    with pytest.raises(ConfigCompositionException):
        compose_train(["replay.no_such_key=1"])


def test_yaml_files_only_set_schema_keys():
    schema = OmegaConf.structured(ExgrpoConfig)
    files = [CONF / g / f"{p}.yaml" for g, p in _presets()] + sorted((CONF / "recipe").glob("*.yaml"))
    for path in files:
        node = OmegaConf.load(path)
        node.pop("defaults", None)
        is_global = path.read_text().startswith("# @package _global_")
        # raises on an unknown key or a wrong type
        OmegaConf.merge(schema if is_global else schema[path.parent.name], node)
