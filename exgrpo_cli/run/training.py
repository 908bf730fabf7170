"""A training run around the step: set up, validate, train, checkpoint, stop cleanly.

`run_training` is the whole of `exgrpo train`: run/setup.py builds the parts (resuming when
there is a checkpoint), then every step is trained, logged, validated every
`trainer.eval_every` steps and checkpointed every `trainer.save_every`. SIGINT/SIGTERM and a
scheduler's warnings (SIGUSR1/SIGUSR2) finish the step in flight, save a checkpoint and exit, and
after a warning the job is requeued (run/preempt.py); before the step loop a SIGTERM/SIGINT ends
the start at once; a run whose updates keep being skipped
stops with its last good state saved.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.checkpoint.store import ResumeRefused
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.bad_rows import LoadReport, skipped_rows_lines
from exgrpo_cli.data.types import Question
from exgrpo_cli.errors import ExgrpoError, UsageError
from exgrpo_cli.evaluation.val_scores import source_scores
from exgrpo_cli.evaluation.validate import sample_and_grade
from exgrpo_cli.metrics import MetricLogger
from exgrpo_cli.metrics.logger import resume_point
from exgrpo_cli.parallel import fsdp as D
from exgrpo_cli.parallel.placement import OFFLOAD_MODES
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.reward.stage import unreachable_threshold
from exgrpo_cli.rollout.base import SamplingSpec
from exgrpo_cli.run import notices, preempt
from exgrpo_cli.run.best import BestCheckpoint
from exgrpo_cli.run.carry import CarriedBuffer, early_read
from exgrpo_cli.run.lock import lock_run_dir
from exgrpo_cli.run.log_files import guard_log_files
from exgrpo_cli.run.preempt import StopRequested
from exgrpo_cli.run.resume import check_resume_buffer, decide_resume
from exgrpo_cli.run.resume_changes import check_resume_changes
from exgrpo_cli.run.setup import build_trainer, load_run_data, share_run_dir, warn_low_precision_weights
from exgrpo_cli.step.loop import Trainer

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


class TrainingAborted(ExgrpoError):
    """The run could not go on; its last good state is saved."""


class Logger(Protocol):
    wandb_id: str | None

    def print(self, msg: str) -> None: ...
    def log(self, step: int, metrics: dict[str, Any], status: str = "") -> None: ...
    def close(self) -> None: ...


class _NoLogger:
    """What ranks other than 0 log to: nothing (rank 0 logs the all-reduced metrics)."""

    wandb_id: str | None = None

    def print(self, msg: str) -> None:
        log.info(msg)

    def log(self, step: int, metrics: dict[str, Any], status: str = "") -> None:
        pass

    def close(self) -> None:
        pass


def run_training(cfg: ExgrpoConfig) -> dict[str, float]:
    t0 = time.time()
    guard_log_files()  # a full disk under train.log: one line, not a traceback per record
    # torchrun: one process per device, all running this function; without torchrun: one rank
    parallel = D.init_distributed(timeout_s=cfg.trainer.dist_timeout_s, device=cfg.trainer.device)
    try:
        # from the start: a warning while the model loads (minutes at scale) stops after step 1;
        # a TERM/INT before the loop ends the start at once (no checkpoint would ever come)
        with StopRequested(defer=False) as stop:
            final = _train(cfg, parallel, stop)
    finally:
        D.close_distributed()
    final["time/total_s"] = time.time() - t0
    # the job's owner requeues it after a warning (the parent of trainer.nproc ranks does it itself)
    if stop.requeue and parallel.is_main and preempt.PARENT_REQUEUES_ENV not in os.environ:
        log.info(preempt.requeue_after_stop(stop.displaced(), cfg.trainer.slurm_requeue))
    return final


def _train(cfg: ExgrpoConfig, parallel: DataParallel, stop: StopRequested) -> dict[str, float]:
    _refuse_before_start(cfg, parallel)
    # replay.init_from: read (or refused) before the run dir is locked or written (run/carry.py)
    carried = early_read(cfg)
    cfg = share_run_dir(cfg, parallel)
    out = Path(cfg.trainer.output_dir)
    lock = lock_run_dir(out, parallel)  # before anything in the dir is read, deleted or written
    try:
        return _train_locked(cfg, parallel, stop, out, carried)
    finally:
        if lock is not None:
            lock.release()


def _start(
    cfg: ExgrpoConfig, parallel: DataParallel, out: Path, carried: CarriedBuffer | None = None
) -> tuple[Logger, Trainer, list[Question], LoadReport, Path | None, list[str]]:
    """Resume decision, metric logger and trainer. A checkpoint that verifies but fails to load
    (trainer.resume=auto) is quarantined like one that fails verification, and the next older one
    is tried; an explicit trainer.resume=<path> that fails to load is refused."""
    notes: list[str] = []
    data = None
    while True:
        resume_from, warnings = decide_resume(cfg, parallel)
        # before the logger or the tracker start, the refusals that need no model: a refused
        # resume (another objective, rollout.n, replay.bucket_by) or bad data creates nothing
        try:  # its state files are read here first: one that does not load is fallen back from
            if resume_from is not None and (changed := check_resume_changes(cfg, resume_from)):
                warnings.append(changed)
            if resume_from is not None:
                check_resume_buffer(cfg, resume_from)
        except ckpt.CheckpointLoadError as err:
            notes += warnings
            _fall_back(cfg, parallel, resume_from, err, notes)
            continue
        notes += warnings
        for w in warnings:
            log.warning(w)
        data = data or load_run_data(cfg, parallel)
        logger = _start_logger(cfg, parallel, out, resume_from)  # before the model: an outage costs seconds
        try:
            trainer, val_qs, report = build_trainer(
                cfg, parallel.device, parallel, resume_from, data, carried
            )
            return logger, trainer, val_qs, report, resume_from, notes
        except ckpt.CheckpointLoadError as err:
            logger.close()
            _fall_back(cfg, parallel, resume_from, err, notes)
        except BaseException:
            logger.close()
            raise


def _fall_back(
    cfg: ExgrpoConfig, parallel: DataParallel, folder: Path | None, err: Exception, notes: list[str]
) -> None:
    """A checkpoint that verified but does not load: trainer.resume=auto quarantines it (rank 0;
    a collective) and notes it, so that the next decide_resume takes an older one; an explicit
    trainer.resume=<path> is refused (exit 2)."""
    if cfg.trainer.resume != "auto" or folder is None:
        raise ResumeRefused(f"trainer.resume={cfg.trainer.resume}: {err}") from None
    target = ckpt.quarantine_target(folder)
    if parallel.is_main:
        ckpt.quarantine(folder, str(err), target)
    parallel.barrier()
    notes.append(f"{err}; quarantined as {target.name}, resuming from an older one if any verifies")
    log.warning(notes[-1])


def _train_locked(
    cfg: ExgrpoConfig, parallel: DataParallel, stop: StopRequested, out: Path, carried: CarriedBuffer | None
) -> dict[str, float]:
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    device = parallel.device  # the compute device init_distributed picked from trainer.device
    if device.type == "cuda" and cfg.model.dtype != "float32" and parallel.is_main:
        warn_low_precision_weights(cfg)
    logger, trainer, val_qs, report, resume_from, warnings = _start(cfg, parallel, out, carried)
    try:
        st = trainer.state
        if parallel.is_main:
            st.wandb_id = logger.wandb_id
        unreachable = unreachable_threshold(cfg.reward)  # nothing would ever count as correct
        for w in [*warnings, *([unreachable] if unreachable else [])]:
            logger.print(f"warning: {w}")
        for line in skipped_rows_lines(report):
            logger.print(line)
        if resume_from is not None:
            logger.print(f"resumed from {resume_from} (step {st.step})")
        params = sum(p.numel() for p in st.model.parameters()) / 1e6
        logger.print(
            f"model {cfg.model.preset or cfg.model.path} ({params:.2f}M params) "
            f"on {device} x{parallel.world_size}; "
            f"{len(st.sampler.questions)} training / {len(val_qs)} held-out questions; "
            f"replay.ratio={cfg.replay.ratio}; output {out}"
        )
        final: dict[str, float] = {}
        if st.step == 0 and val_qs:
            first = validate(trainer, val_qs)
            logger.log(0, {**first, "data/skipped_rows": float(report.skipped)})
            final["val/accuracy@0"] = first["val/accuracy"]
        _loop(trainer, val_qs, logger, out, final, stop)
        return final
    finally:
        logger.close()
        trainer.scorer.close()
        trainer.engine.close()


def _refuse_before_start(cfg: ExgrpoConfig, parallel: DataParallel) -> None:
    """Settings this run cannot honour, refused before any collective: an offload the trainer
    would not apply, questions the ranks cannot share."""
    a, world = cfg.algo, parallel.world_size
    if OFFLOAD_MODES[cfg.trainer.offload].params_on_host and not D.shards_alone(parallel):
        raise UsageError(
            "trainer.offload=all is FSDP2's CPU offload, and a one-process CPU run is not sharded "
            "(its whole state is in host memory already): use trainer.offload=none, or several "
            "ranks (trainer.nproc)"
        )
    if not parallel.distributed:
        return  # config validation already asks for updates_per_step <= questions_per_step
    if a.questions_per_step % world:
        raise UsageError(
            f"algo.questions_per_step={a.questions_per_step} must be a "
            f"multiple of the {world} ranks (each trains on an equal share)"
        )
    # each rank cuts its own groups into the step's mini-batches: with fewer groups than updates
    # some mini-batches would be empty and the step would silently make fewer updates
    share = a.questions_per_step // world
    if a.updates_per_step > share:
        raise UsageError(
            f"algo.updates_per_step={a.updates_per_step} is more than the {share} questions each of "
            f"the {world} ranks trains on (algo.questions_per_step={a.questions_per_step}): every "
            "update needs at least one question per rank; lower algo.updates_per_step or raise "
            "algo.questions_per_step"
        )


def _start_logger(cfg: ExgrpoConfig, parallel: DataParallel, out: Path, resume_from: Path | None) -> Logger:
    """Rank 0's metric logger (the tracker included), set up before anything loads: an unreachable
    W&B server falls back or refuses within seconds. Rank 0's failure, whatever it is, is every
    rank's: the others would otherwise wait in the broadcast until trainer.dist_timeout_s. Rank 0
    raises its own exception; the others a UsageError for a refusal, else an ExgrpoError."""
    logger: Logger = _NoLogger()
    failure: tuple[bool, str, str] | None = None  # (a refusal?, the exception's type, its message)
    if parallel.is_main:
        try:
            start, wandb_id = resume_point(resume_from)
            logger = MetricLogger(
                str(out), cfg.logger, dataclasses.asdict(cfg), cfg.trainer.steps, start, wandb_id
            )
        except Exception as err:
            parallel.from_main((isinstance(err, UsageError), type(err).__name__, str(err)))
            raise
    failure = parallel.from_main(failure)
    if failure is not None:
        refused, kind, message = failure
        if refused:
            raise UsageError(message)
        raise ExgrpoError(f"rank 0 could not start its metric logger: {kind}: {message}")
    return logger


def _loop(
    trainer: Trainer,
    val_qs: list[Question],
    logger: Logger,
    out: Path,
    final: dict[str, float],
    stop: StopRequested,
) -> None:
    st, parallel, t = trainer.state, trainer.parallel, trainer.cfg.trainer
    switch, ratio, warned = st.switch, trainer.cfg.replay.ratio, False
    top_reward, empty_warned = -math.inf, False  # the run's highest fresh reward (this process's)
    best = BestCheckpoint(out / "checkpoints", st, parallel, t.best_metric) if t.keep_best else None
    with stop:
        stop.training()  # a signal now waits for the step's end and its checkpoint
        for step in range(st.step + 1, t.steps + 1):
            raw = trainer.train_step(step)
            peaks = {k: v for k, v in raw.items() if k.startswith("memory/")}
            metrics = parallel.mean({k: v for k, v in raw.items() if k not in peaks})  # run-wide means
            metrics.update(parallel.max(peaks))  # memory: the fullest rank
            last = step == t.steps
            if val_qs and (last or (t.eval_every and step % t.eval_every == 0)):
                metrics.update(validate(trainer, val_qs))
            acc = metrics.get("reward/accuracy")
            status = notices.replay_status(ratio, switch.active, switch.threshold, acc)
            logger.log(step, metrics, status=status)
            for line in trainer.watch.take_lines():  # the warning band (step/offpolicy.py)
                logger.print(line)
            warning = notices.delayed_start_warning(
                step, t.steps, switch.active, switch.threshold, ratio, warned, acc
            )
            if warning:  # once: replay has not started after a sizeable share of the run
                logger.print(warning)
                warned = True
            top_reward = max(top_reward, metrics.get("reward/max", -math.inf))
            empty = notices.empty_buffer_warning(
                step,
                t.steps,
                ratio,
                switch.active,
                metrics.get("replay/buffer_questions"),
                top_reward,
                trainer.cfg.reward.correct_at,
                empty_warned,
            )
            if empty:  # once: the buffer is empty, most likely from reward.correct_at
                logger.print(empty)
                empty_warned = True
            final.update({k: v for k, v in metrics.items() if k.startswith("val/")})
            give_up = st.skipped_in_a_row >= t.max_skipped_steps
            # a signal may reach one rank only: all ranks stop at the same step (and requeue or not)
            code = parallel.max({"stop": float(stop.code)})["stop"]
            stop.agree(int(code))
            improved = best is not None and best.improved(metrics.get(t.best_metric))
            if improved and best is not None:
                best.record(step, metrics[t.best_metric])
            saved_s = time.monotonic()
            if last or stop.flag or give_up or improved or (t.save_every and step % t.save_every == 0):
                saved = st.save(out / "checkpoints", t.keep_checkpoints, trainer.tokenizer, parallel, last)
                if improved and best is not None:
                    best.keep(saved, step, metrics[t.best_metric])
            saved_s = time.monotonic() - saved_s
            if give_up:
                raise TrainingAborted(
                    f"{st.skipped_in_a_row} optimizer updates in a row were skipped (non-finite loss "
                    "or gradient, or a gradient norm above algo.skip_grad_norm_above; "
                    f"trainer.max_skipped_steps={t.max_skipped_steps}); the last good state is saved"
                )
            if stop.flag:
                logger.print(
                    f"stopped at step {step}{stop.since()}, its checkpoint written in {saved_s:.1f} s; "
                    "resume with the same command"
                )
                break
    summary = notices.replay_summary(ratio, switch.active, switch.started_at, switch.threshold, st.step)
    if summary:
        logger.print(summary)
    if best is not None:
        logger.print(best.summary())


def validate(trainer: Trainer, val_qs: list[Question]) -> dict[str, float]:
    """Held-out accuracy: `trainer.val_samples` samples per question at `trainer.val_temperature`
    (default: the rollout temperature), drawn with the same seed at every evaluation."""
    cfg = trainer.cfg
    t = cfg.trainer.val_temperature
    spec = SamplingSpec(
        cfg.rollout.temperature if t is None else t,
        cfg.rollout.top_p,
        cfg.model.max_response_tokens,
        seed=cfg.trainer.seed * 1000003 + 7,
    )
    res = sample_and_grade(
        trainer.engine,
        trainer.tokenizer,
        trainer.template,
        val_qs,
        trainer.scorer,
        n=cfg.trainer.val_samples,
        spec=spec,
        parallel=trainer.parallel,
    )
    # vLLM asleep again until the next step's rollout (a no-op otherwise). Level 2 by default: the
    # next rollout syncs the weights again (seconds at 7B); level 1 would keep them in pinned host
    # memory, rounded up by torch's host allocator and never given back (plan/host.py)
    trainer.engine.release(keep_weights=cfg.rollout.validation_sleep_level == 1)
    # per data source too when the held-out rows name theirs (the official valid.parquet does)
    scores = {"val/accuracy": res.accuracy, f"val/pass@{cfg.trainer.val_samples}": res.pass_at_n}
    return {**scores, **source_scores(res.questions, res.correct)}
