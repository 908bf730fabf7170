"""The schema's sections of the training run: `rollout`, `algo`, `reward`, `logger` and `trainer`
(`replay` has its own module, config/replay.py; exgrpo_cli/config/schema.py assembles the sections)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING


@dataclass
class RolloutConfig:
    engine: str = field(default="hf", metadata={"help": "a name of rollout.ENGINES"})
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
    # model.lora.rank > 0 with vLLM: merge the adapter into the base weights, or load it per sync.
    # merged is the provisional default (docs/scaling-up.md, LoRA): under sleep_mode's level-2
    # sleep each step the adapter sync must send the base again too
    lora_sync: str = field(
        default="merged",
        metadata={
            "help": "vLLM with model.lora: merged (W + BA synced as full weights; plain kernels) or "
            "adapter (vLLM's LoRA kernels; a sync moves the adapter, and the base after a sleep)"
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
        default="exgrpo", metadata={"help": "the per-token policy loss, a name of algo.POLICY_LOSSES"}
    )
    aggregation: str = field(
        default="drgrpo",
        metadata={"help": "how token losses sum to the objective, a name of algo.AGGREGATIONS"},
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
class RewardModelConfig:
    """`reward=model`: a Hugging Face sequence-classification reward model (never remote code)."""

    path: str = field(default="", metadata={"help": "HF id or local folder of the reward model"})
    device: str = field(
        default="", metadata={"help": "where it runs: '' = the trainer's device, or cpu/cuda"}
    )
    batch_size: int = field(default=16, metadata={"help": "responses per forward of the reward model"})
    max_tokens: int = field(default=1024, metadata={"help": "longer (prompt + response) inputs are cut"})
    normalise: str = field(
        default="none", metadata={"help": "how its score becomes the reward, a name of reward.NORMALISE"}
    )


@dataclass
class RewardConfig:
    """The reward stage (exgrpo_cli/reward/stage.py): what turns a response into a number."""

    kind: str = field(default="math", metadata={"help": "a name of reward.REWARDS"})
    # several kinds at once: the reward is sum(weight x kind's reward); each kind reads its own
    # settings below (reward.function, reward.model), so a kind appears at most once
    components: dict[str, float] = field(
        default_factory=dict,
        metadata={
            "help": "several kinds with weights, kind -> weight (+reward.components.math=1.0 "
            "+reward.components.model=0.5): the weighted sum trains (reward.kind is then unused); "
            "{}: reward.kind alone"
        },
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
    # resumes in the same run dir (run/preempt.py)
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
    fetch_only: bool = field(
        default=False,
        metadata={"help": "download the data, held-out file and weights into the caches, then exit"},
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
    # optimizer: AdamW's moments in host memory (parallel/offload.py); all: weights, gradients and
    # optimizer (FSDP2's CPU offload)
    offload: str = field(
        default="none",
        metadata={"help": "where the sharded trainer state lives, a name of parallel.OFFLOAD_MODES"},
    )
    resume_changes: bool = field(
        default=False,
        metadata={
            "help": "resume although the command's reward, replay, algo, model, data or rollout "
            "settings differ from those the checkpoint was trained with (each difference is named)"
        },
    )
    resume_new_data: bool = field(
        default=False,
        metadata={
            "help": "resume although the questions (a fingerprint of their ids) differ from the "
            "checkpoint's: the sampler starts afresh on the new data, the buffer keeps its experiences"
        },
    )
