"""The names each registry holds, by config key: generated from the registries (commands/
variants.py's `registries`) by `python -m exgrpo_cli.commands.variants --write`; do not edit.
Read by config/keys.py, so that `exgrpo <command> --help` lists a key's allowed names without
importing the modules (and torch) that implement them. tests/commands/test_variant_names.py
keeps it current."""

NAMES: dict[str, tuple[str, ...]] = {
    "model.template": (
        "think_short",
        "think",
        "boxed_chat",
        "llama_base",
        "plain",
    ),
    "data.source": (
        "synthetic",
        "local",
        "jsonl",
        "parquet",
        "hf",
    ),
    "data.draw": (
        "needed",
        "batch",
    ),
    "rollout.engine": (
        "hf",
        "vllm",
    ),
    "algo.loss": ("exgrpo",),
    "algo.aggregation": (
        "drgrpo",
        "official",
    ),
    "replay.question_selection": (
        "gaussian",
        "uniform",
    ),
    "replay.trajectory_selection": (
        "lowest_entropy",
        "highest_entropy",
        "lowest_nll",
        "random",
        "shortest",
    ),
    "replay.method": (
        "exgrpo",
        "prompt",
        "prioritized",
        "rlep",
        "repo",
        "luffy",
    ),
    "replay.bucket_by": (
        "count",
        "reward_std",
    ),
    "reward.kind": (
        "math",
        "choice",
        "python",
        "model",
    ),
    "reward.model.normalise": (
        "none",
        "sigmoid",
    ),
    "trainer.offload": (
        "none",
        "optimizer",
        "all",
    ),
    "eval.suite": (
        "id",
        "ood",
        "paper",
        "synthetic",
        "custom",
    ),
}
