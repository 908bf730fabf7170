"""The one way a training run loads its policy: the model config, the data-parallel object, the
offload mode and what to resume from in; the model (sharded where the ranks need it), its
tokenizer and the resumed adapter out.

Where it sits: called once by run/setup.py's `build_trainer`, before the rollout engine and the
optimizer are built (fully_shard swaps the parameters for DTensors, which the optimizer must see).
The checks that need the tokenizer but not the weights (the template's budget, the prompts'
length, the model's size) run in `before_weights`, so that a refusal comes before any weight is
read.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from exgrpo_cli.checkpoint.store import ResumeRefused
from exgrpo_cli.config.schema import ModelConfig
from exgrpo_cli.parallel import fsdp
from exgrpo_cli.parallel.placement import Offload
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy import lora
from exgrpo_cli.policy.model import load_model, load_sharded, load_tokenizer, resolve_path

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass
class Policy:
    """What `load_policy` returns. `source` is the model config the weights were read with (the
    checkpoint's model folder at a full-weight resume, the base in the frozen dtype under LoRA);
    `adapter` is the checkpoint's adapter folder a LoRA run resumed, else None."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: ModelConfig
    adapter: Path | None


def load_policy(
    cfg: ModelConfig,
    parallel: DataParallel,
    offload: Offload,
    mixed_precision: str,
    resume_from: Path | None = None,
    before_weights: Callable[[ModelConfig, PreTrainedTokenizerBase], None] | None = None,
) -> Policy:
    """The policy of a run on `parallel.device`: under torchrun rank 0 alone reads the weights and
    every rank gets its shards; on one GPU FSDP2 wraps (or offloads) it; on one CPU it is a plain
    model. `mixed_precision` is trainer.fsdp_mixed_precision ("" for none). Collective under
    torchrun: every rank calls it."""
    source = cfg
    # LoRA resumes the base of the command and the checkpoint's adapter (refused first if they differ)
    adapter = lora.resume_adapter(cfg.lora, cfg.path, resume_from) if resume_from else None
    if resume_from is not None and adapter is None:  # weights from the checkpoint, the rest from the config
        source = dataclasses.replace(cfg, path=str(resume_from / "model"), gguf_file="")
    on_gpu = parallel.device.type == "cuda"  # model.lora: the frozen base in the compute dtype
    source = lora.frozen_base_dtype(source, mixed_precision, on_gpu)
    # rank 0 first: a hub tokenizer is downloaded once, the other ranks read its copy
    tokenizer = parallel.main_first(lambda: load_tokenizer(source))
    lora.check_base(source, resolve_path(source.path))  # model.lora's rank and targets
    if before_weights is not None:
        before_weights(source, tokenizer)

    # shard before the optimizer is built: fully_shard swaps the parameters for DTensors
    def shard(m: PreTrainedModel) -> PreTrainedModel:
        return fsdp.wrap_fsdp2(m, parallel, mixed_precision=mixed_precision or None, offload=offload)

    if parallel.distributed:  # under torchrun rank 0 alone reads the weights; the others get their shards
        model = load_sharded(source, parallel, shard, offload=offload)
    elif fsdp.shards_alone(parallel):  # one GPU: loaded in host memory, FSDP2 places (or offloads) it
        model = shard(load_model(source, torch.device("cpu")))
    else:
        model = load_model(source, parallel.device)
    if adapter is not None and (wrong := lora.base_mismatch(adapter, cfg.path, model)):
        raise ResumeRefused(wrong)  # the shapes: the name was checked before the load
    if lora.is_lora(model):
        log.info("%s", lora.describe(model))
    return Policy(model=model, tokenizer=tokenizer, source=source, adapter=adapter)
