"""Building a training run before its first step: data, model, run state, rollout engine, grader
and the variants the config names.

Where it sits: once, before the loop of run/training.py, after the resume decision (run/resume.py).
Everything that can refuse (the resume decision, the data) runs before any weights load.
`build_trainer` builds the parts without a run directory or logging, so benchmarks and tests get
exactly what `exgrpo train` trains with.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from exgrpo_cli.algo.aggregation import AGGREGATIONS, AggregationSettings
from exgrpo_cli.algo.losses import POLICY_LOSSES
from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.config.paths import hydra_config
from exgrpo_cli.config.registry import pick
from exgrpo_cli.config.schema import ExgrpoConfig, ModelConfig
from exgrpo_cli.data.bad_rows import PROMPT_TOO_LONG, DataError, LoadReport
from exgrpo_cli.data.sampler import FRESH_DRAWS, QuestionSampler, check_pool_size
from exgrpo_cli.data.sources import load_questions
from exgrpo_cli.data.template_budget import check_template
from exgrpo_cli.data.templates import Template, get_template
from exgrpo_cli.data.types import Question
from exgrpo_cli.errors import UsageError
from exgrpo_cli.evaluation.val_scores import check_best_metric
from exgrpo_cli.parallel.offload import HostAdamW
from exgrpo_cli.parallel.placement import OFFLOAD_MODES, Offload
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.plan.model_bounds import check_model
from exgrpo_cli.policy import lora
from exgrpo_cli.policy.load import load_policy
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.method_registry import build_replay_method
from exgrpo_cli.replay.schedule import DelayedStart
from exgrpo_cli.reward.stage import Reward, build_reward, needs_answer
from exgrpo_cli.rollout import build_engine
from exgrpo_cli.run.carry import CarriedBuffer, carried_questions, read_init_from, start_buffer
from exgrpo_cli.run.log_files import guard_log_files, open_log
from exgrpo_cli.run.resume import check_resume_data, data_fingerprint
from exgrpo_cli.run.resume_changes import trained_with
from exgrpo_cli.step.loop import Choices, Trainer
from exgrpo_cli.step.state import RunState

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def make_optimizer(cfg: ExgrpoConfig, model: torch.nn.Module, offload: Offload) -> torch.optim.Optimizer:
    a = cfg.algo
    # trainer.offload=optimizer: the same AdamW with its moments in host memory
    cls = HostAdamW if offload.host_adamw else torch.optim.AdamW
    return cls(
        [p for p in model.parameters() if p.requires_grad],
        lr=a.lr,
        weight_decay=a.weight_decay,
        betas=(a.betas[0], a.betas[1]),
    )


def choices(cfg: ExgrpoConfig) -> Choices:
    return Choices(
        loss=pick(POLICY_LOSSES, "algo.loss", cfg.algo.loss),
        aggregation=pick(AGGREGATIONS, "algo.aggregation", cfg.algo.aggregation)(
            AggregationSettings(**dataclasses.asdict(cfg.algo.official_batch))
        ),
        method=build_replay_method(cfg),
        draw=pick(FRESH_DRAWS, "data.draw", cfg.data.draw),
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


RunData = tuple[list[Question], list[Question], LoadReport]


def load_run_data(cfg: ExgrpoConfig, parallel: DataParallel) -> RunData:
    """The training and held-out questions and the report of skipped rows: called by run/training.py
    before the logger or a tracker start (a data refusal creates nothing). The loaders seed their
    own generators: the global RNGs are untouched."""
    # rank 0 first: a hub dataset or tokenizer is downloaded once, the other ranks read its copy
    train_qs, val_qs, report = parallel.main_first(
        lambda: load_questions(cfg.data, answer_required=needs_answer(cfg.reward))
    )
    if cfg.trainer.val_questions:
        val_qs = val_qs[: cfg.trainer.val_questions]
    return train_qs, val_qs, report


def build_trainer(
    cfg: ExgrpoConfig,
    device: torch.device,
    parallel: DataParallel | None = None,
    resume_from: Path | None = None,
    data: RunData | None = None,
    carried: CarriedBuffer | None = None,
) -> tuple[Trainer, list[Question], LoadReport]:
    """The trainer of a run (resumed from `resume_from` when given), its held-out questions and
    the report of skipped data rows (`data`: as `load_run_data` gave them, else loaded here). Seeds
    the global RNGs first, as a run does. Without `parallel`: one process computing on `device`. A
    fresh run with replay.init_from starts with that buffer: `carried` when the caller read it
    already (run/carry.py `early_read`), else read here."""
    parallel = parallel if parallel is not None else DataParallel(device=device)
    seed_everything(cfg.trainer.seed)
    train_qs, val_qs, report = data if data is not None else load_run_data(cfg, parallel)
    report = copy.deepcopy(report)  # counts the prompts filtered below: a retried start counts afresh
    offload = OFFLOAD_MODES[cfg.trainer.offload]  # the one lookup: every part below gets the mode
    template = get_template(cfg.model.template)
    fingerprint = ""
    new_data = False

    # what needs the tokenizer but not the weights: a refusal here comes before any weight is read
    def before_weights(source: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        nonlocal train_qs, fingerprint, new_data, carried
        # rendered for every question below: first once, under a time and memory budget
        check_template(template, tokenizer, f"model {source.path}")
        check_model(source.path, source.gguf_file, source.dtype)  # config.json vs weights, memory
        train_qs = filter_long(train_qs, template, tokenizer, cfg.model.max_prompt_tokens, report)
        check_pool_size(len(train_qs), cfg.algo.questions_per_step)  # the first step draws that many
        fingerprint = data_fingerprint(train_qs)
        new_data = resume_from is not None and check_resume_data(cfg, resume_from, fingerprint)
        check_best_metric(cfg.trainer.best_metric, cfg.trainer.keep_best, val_qs)
        if resume_from is None and cfg.replay.init_from:  # a resume keeps its own buffer
            carried = carried if carried is not None else read_init_from(cfg, tokenizer)
            check_carried(carried, {q.uid for q in train_qs})

    policy = load_policy(
        cfg.model, parallel, offload, cfg.trainer.fsdp_mixed_precision, resume_from, before_weights
    )
    model, tokenizer = policy.model, policy.tokenizer
    # every rank, at this same point (vLLM's start-up all-reduces the ranks' free memory), and
    # before the optimizer state takes memory; a vLLM engine empties torch's cache first
    engine = build_engine(cfg, model, tokenizer)
    scorer: Reward | None = None
    try:
        state = RunState(
            model=model,
            optimizer=make_optimizer(cfg, model, offload),
            sampler=QuestionSampler(train_qs, cfg.trainer.seed),
            buffer=ExperienceBuffer(
                cfg.rollout.n,
                cfg.replay.bucket_edges,
                cfg.replay.max_experiences,
                cfg.replay.bucket_by,
                cfg.replay.max_age,
            ),
            switch=DelayedStart(cfg.replay.start_threshold),
            seed=cfg.trainer.seed,
            data_fingerprint=fingerprint,
            trained_with=trained_with(cfg),
        )
        picked = choices(cfg)
        if resume_from is not None:
            _load_checkpoint(state, resume_from, parallel, new_data)
            # a resume under another replay.method (trainer.resume_changes): can it replay this?
            reason = picked.method.replays(state.buffer)
            if reason:
                raise UsageError(
                    f"cannot resume {resume_from} with replay.method={cfg.replay.method}: {reason}"
                )
        elif carried is not None and cfg.replay.init_from:
            _start_with(state, carried, {q.uid for q in train_qs}, parallel)
        scorer = build_reward(cfg.reward, template.requires_think, parallel.device)
        trainer = Trainer(cfg, state, tokenizer, template, engine, scorer, picked, parallel=parallel)
    except BaseException:
        # the caller closes the engine and grader of the trainer it gets; without one (a checkpoint
        # that does not load, ...) they are closed here: vLLM's workers and GPU memory, the
        # grader's worker processes would outlive the failed start
        if scorer is not None:
            scorer.close()
        engine.close()
        raise
    return trainer, val_qs, report


def check_carried(carried: CarriedBuffer, uids: set[str]) -> None:
    """Refuse a carried buffer none of whose questions is in this run's training data."""
    kept, dropped = carried_questions(carried, uids)
    if dropped and not kept:
        raise UsageError(
            f"replay.init_from={carried.checkpoint}: none of its {len(dropped)} buffered questions is in "
            "this run's training data (data.*), so none could be replayed"
        )


def _start_with(state: RunState, carried: CarriedBuffer, uids: set[str], parallel: DataParallel) -> None:
    """Put the carried buffer into the fresh run's. With replay.start_threshold <= 0 the delayed start
    is on from step 0, so that replay starts at step 1 (an empty buffer is why it otherwise waits
    for the step after the switch: docs/algorithm.md §5); above 0 the new policy must reach it."""
    line = start_buffer(carried, uids)
    state.buffer = carried.buffer  # read with this run's settings (run/carry.py `read_init_from`)
    if state.switch.threshold <= 0:
        state.switch.update(0, 0.0)
    log.info("%s", line)
    if parallel.is_main:
        print(f"exgrpo train: {line}", file=sys.stderr)


def _load_checkpoint(state: RunState, folder: Path, parallel: DataParallel, new_data: bool) -> None:
    """`state.load`, any failure of which (after verify passed) is a CheckpointLoadError: resume
    quarantines the checkpoint and falls back as for one that fails verification."""
    try:
        notes = state.load(folder, parallel, new_data)
    except Exception as err:  # noqa: BLE001 - whatever a crafted file trips
        raise ckpt.CheckpointLoadError(
            f"{folder} does not load: {type(err).__name__}: {str(err)[:300]}"
        ) from None
    for note in notes:
        log.warning("%s", note)
        if parallel.is_main:
            print(f"exgrpo train: warning: {note}", file=sys.stderr)


def filter_long(
    questions: list[Question], template: Template, tokenizer: Any, limit: int, report: LoadReport
) -> list[Question]:
    kept = []
    for q in questions:
        n = len(template.prompt_ids(q, tokenizer))
        if n <= limit:
            kept.append(q)
        else:
            report.skip(
                f"{q.uid}: prompt of {n} tokens > model.max_prompt_tokens={limit}", False, PROMPT_TOO_LONG
            )
    if not kept:
        raise DataError(f"every prompt is longer than model.max_prompt_tokens={limit}")
    return kept


def warn_low_precision_weights(cfg: ExgrpoConfig) -> None:
    """bf16 keeps 8 bits of mantissa: an AdamW step of ~lr on a weight of ~1e-2 rounds away when
    lr is 1e-6 (the paper's), so bf16 *weights* may not train at all. Mixed precision keeps fp32
    master weights and computes in bf16; say so once, at start-up, where it is still cheap to fix.
    Not with model.lora: the base is frozen in bf16 and the trained adapters are float32."""
    if lora.lora_on(cfg.model.lora):
        return
    msg = (
        f"model.dtype={cfg.model.dtype}: the trained weights themselves are {cfg.model.dtype}; "
        f"updates below ~1/256 of a weight round away (algo.lr={cfg.algo.lr:g}). For training prefer "
        "model.dtype=float32 trainer.fsdp_mixed_precision=bf16 (fp32 master weights, bf16 compute "
        "and vLLM) under torchrun"
    )
    log.warning(msg)
    print(f"exgrpo train: warning: {msg}", file=sys.stderr)


def share_run_dir(cfg: ExgrpoConfig, parallel: DataParallel) -> ExgrpoConfig:
    """torchrun: each rank resolved Hydra's timestamped run dir on its own, and start-up skew can
    put two ranks a second apart, i.e. in two dirs. Rank 0's is the run's: the others adopt it,
    write their log to `<its hydra dir>/<job>.rank<k>.log`, and remove the stray dir Hydra made
    for them when it holds nothing but Hydra's own files."""
    if not parallel.distributed:
        return cfg
    hc = hydra_config()  # None outside @hydra.main (e.g. from a test)
    own = str(hc.runtime.output_dir) if hc is not None else None
    out0, hydra0 = parallel.from_main((cfg.trainer.output_dir, own))
    if parallel.is_main or own is None or hydra0 is None:
        return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=out0))
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        name = Path(h.baseFilename)
        if name.parent != Path(own):
            continue
        new = open_log(Path(hydra0) / f"{name.stem}.rank{parallel.rank}{name.suffix}")
        new.setFormatter(h.formatter)
        new.setLevel(h.level)
        root.removeHandler(h)
        h.close()
        root.addHandler(new)
        guard_log_files()  # the new handler too: a full disk is one line
    stray = Path(own)
    if stray.resolve() not in (Path(hydra0).resolve(), Path(out0).resolve()) and stray.is_dir():
        hydra_only = all(p.name == ".hydra" or p.suffix == ".log" for p in stray.iterdir())
        if hydra_only:
            shutil.rmtree(stray, ignore_errors=True)
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=out0))
