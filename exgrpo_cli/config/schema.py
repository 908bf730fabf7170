"""The one typed configuration schema of exgrpo.

Every key a user can set lives here (its sections in config/model.py, config/train.py,
config/replay.py and config/commands.py), with its type, default and meaning; the YAML files under
`conf/` only choose presets and override values. Hydra validates types when it merges the YAML
and the command line into these dataclasses; `validate()` (config/checks.py) then checks the
ranges and the rules that span several fields, so that a bad value stops the run with exit code 2
*before* any model is loaded. Library code receives these dataclasses (via `to_object`), never a
DictConfig.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exgrpo_cli.config.commands import AblationConfig, EvalConfig, InspectConfig
from exgrpo_cli.config.model import ArchConfig, DataConfig, LoraConfig, ModelConfig, SyntheticConfig
from exgrpo_cli.config.replay import PrioritizedReplayConfig, PromptReplayConfig, ReplayConfig
from exgrpo_cli.config.train import (
    AlgoConfig,
    LoggerConfig,
    OfficialBatchConfig,
    RewardConfig,
    RewardModelConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    TrainerConfig,
    WandbConfig,
)
from exgrpo_cli.errors import UsageError

__all__ = [
    "AblationConfig",
    "AlgoConfig",
    "ArchConfig",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "ExgrpoConfig",
    "InspectConfig",
    "LoggerConfig",
    "LoraConfig",
    "ModelConfig",
    "OfficialBatchConfig",
    "PrioritizedReplayConfig",
    "PromptReplayConfig",
    "ReplayConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "SyntheticConfig",
    "TrainerConfig",
    "WandbConfig",
]


class ConfigError(UsageError, ValueError):
    """A configuration value is out of its allowed range; the message names the key."""


@dataclass
class ExgrpoConfig:
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "the policy model"})
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "the training questions"})
    rollout: RolloutConfig = field(
        default_factory=RolloutConfig, metadata={"help": "how responses are sampled"}
    )
    algo: AlgoConfig = field(default_factory=AlgoConfig, metadata={"help": "the policy update"})
    replay: ReplayConfig = field(
        default_factory=ReplayConfig, metadata={"help": "the experience replay buffer (ExGRPO)"}
    )
    reward: RewardConfig = field(
        default_factory=RewardConfig, metadata={"help": "the reward stage: what scores a response"}
    )
    logger: LoggerConfig = field(default_factory=LoggerConfig, metadata={"help": "console and W&B logging"})
    trainer: TrainerConfig = field(
        default_factory=TrainerConfig, metadata={"help": "the training loop, devices and checkpoints"}
    )
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"help": "exgrpo eval"})
    ablation: AblationConfig = field(default_factory=AblationConfig, metadata={"help": "exgrpo ablate"})
    inspect: InspectConfig = field(default_factory=InspectConfig, metadata={"help": "exgrpo inspect-buffer"})


# Keys that name code, a model or data. A command that reads a run it did not write (inspect-buffer
# reading a run's saved config; eval and resume read no saved config at all) takes these from its
# own config, never from the run's: a run dir you downloaded is data (docs/faults-and-resuming.md).
# A section name covers every key under it. To register a new key that names code, a model or data
# (e.g. reward.function, reward.model.path, an adapter's base), add its dotted name here;
# tests/test_config.py checks that each entry names a key of the schema.
COMMAND_ONLY: tuple[str, ...] = (
    "reward.function",
    "reward.model.path",
    "model.path",
    "model.gguf_file",
    "model.trust_remote_code",
    "model.arch.describes",
    "data",
    "eval.adapter",
)


def with_own_command_only(run: ExgrpoConfig, own: ExgrpoConfig) -> ExgrpoConfig:
    """`run` (a config read from a run) with every COMMAND_ONLY key replaced by `own`'s value."""
    import dataclasses

    def put(obj: Any, src: Any, parts: list[str]) -> Any:
        head, rest = parts[0], parts[1:]
        value = getattr(src, head) if not rest else put(getattr(obj, head), getattr(src, head), rest)
        return dataclasses.replace(obj, **{head: value})

    for key in COMMAND_ONLY:
        run = put(run, own, key.split("."))
    return run


def register_configs() -> None:
    """Register the schema so that conf/config.yaml is type-checked against it."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="exgrpo_schema", node=ExgrpoConfig)
