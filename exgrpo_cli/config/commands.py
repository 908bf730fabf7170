"""The schema's sections of the other commands: `eval`, `ablation` and `inspect` (part of the one
schema, exgrpo_cli/config/schema.py, which assembles the sections)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# `eval.data_dir`'s default, the per-user cache of the paper's benchmark files: an interpolation
# Hydra resolves (oc.env is OmegaConf's own resolver), written this way so that `--help` and the
# config reference show the rule, not one user's home folder; data/pinned.py's `resolve_data_dir`
# applies the same rule outside Hydra.
DEFAULT_DATA_DIR = "${oc.env:XDG_CACHE_HOME,'~/.cache'}/exgrpo/benchmarks"


@dataclass
class EvalConfig:
    suite: str = field(
        default="synthetic", metadata={"help": "a name of evaluation.SUITES (the eval= preset sets it)"}
    )
    benchmarks: list[str] = field(default_factory=list, metadata={"help": "filled by the suite preset"})
    data_dir: str = field(
        default=DEFAULT_DATA_DIR,
        metadata={
            "help": "folder of the official benchmark files (default: the per-user cache, filled on "
            "first use; a folder of your own is read as it is)"
        },
    )
    data_url: str = field(
        default="",
        metadata={
            "help": 'a mirror serving the benchmark files as <data_url>/<file> ("": the official URLs)'
        },
    )
    fetch_timeout_s: float = field(
        default=60.0, metadata={"help": "seconds a benchmark download may wait for data before it stops"}
    )
    fetch_only: bool = field(
        default=False,
        metadata={"help": "download the suite's files and the model's weights into the caches, then exit"},
    )
    published: str = field(
        default="",
        metadata={
            "help": "the paper's figures shown beside yours: <backbone>/<row> (\"\": the model preset's, "
            "none: off)"
        },
    )
    path: str = field(default="", metadata={"help": "custom suite: a local parquet/jsonl file"})
    k: int = field(default=1, metadata={"help": "pass@k reported besides avg@n"})
    n: int = field(default=0, metadata={"help": "samples per question (0: each benchmark's paper default)"})
    temperature: float = field(default=0.6, metadata={"help": "sampling temperature of the evaluation"})
    top_p: float = field(
        default=1.0, metadata={"help": "nucleus sampling threshold of the evaluation (1: off)"}
    )
    max_new_tokens: int = field(default=0, metadata={"help": "0: the model preset's max_response_tokens"})
    limit: int = field(default=0, metadata={"help": "first N questions of each benchmark (0: all)"})
    regrade: str = field(
        default="", metadata={"help": "a generations.jsonl to grade again without generating"}
    )
    compare: list[str] = field(default_factory=list, metadata={"help": "several checkpoints in one table"})
    adapter: str = field(
        default="",
        metadata={"help": "a LoRA checkpoint (or run, or adapter folder) evaluated on its base, model.path"},
    )
    output_dir: str = field(default="", metadata={"help": "default: the Hydra run dir"})
    batch_size: int = field(default=64, metadata={"help": "prompts per generate call"})


@dataclass
class AblationConfig:
    name: str = field(default="", metadata={"help": "the ablation's name (its preset file names it)"})
    seeds: int = field(
        default=3, metadata={"help": "runs per variant, with trainer.seed, trainer.seed+1, ..."}
    )
    variants: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "name -> list of overrides (first: baseline)"}
    )
    base: list[str] = field(
        default_factory=list, metadata={"help": "overrides of every run (the command line's win)"}
    )
    baseline: str = field(
        default="", metadata={"help": 'the variant the differences are taken against ("": the first)'}
    )
    compare_to: dict[str, str] = field(
        default_factory=dict, metadata={"help": "variant -> its own reference (else baseline)"}
    )
    sweep_dir: str = field(
        default="",
        metadata={"help": 'where the runs go ("": this command\'s run dir); finished runs are kept'},
    )
    dry_run: bool = field(
        default=False, metadata={"help": "print the runs' `exgrpo train` commands and stop"}
    )
    summarize: str = field(default="", metadata={"help": "a sweep dir: only redo the summary"})


@dataclass
class InspectConfig:
    target: str = field(default="", metadata={"help": "a run dir or a checkpoint dir"})
    format: str = field(default="text", metadata={"help": "text | json"})
    plot: bool = field(default=False, metadata={"help": "draw the buffer's plots (PNG) into inspect.out_dir"})
    out_dir: str = field(
        default="", metadata={"help": 'where inspect.plot writes buffer.png ("": this command\'s run dir)'}
    )
    show: str = field(default="", metadata={"help": "a question id: print its stored responses"})
    score: bool = field(
        default=False, metadata={"help": "with show: entropy of each response under the checkpoint's policy"}
    )
