"""A training run around the step: build the parts, resume, validate, checkpoint, stop cleanly.

Resume (`trainer.resume`): auto continues from the latest complete checkpoint of
`trainer.output_dir`; never starts fresh (and refuses a non-empty dir unless
`trainer.overwrite=true`); a path resumes from that checkpoint. SIGINT/SIGTERM finish the step in
flight, save a checkpoint and exit.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from exgrpo_cli.config import ExgrpoConfig
from exgrpo_cli.data.sampler import QuestionSampler
from exgrpo_cli.data.sources import load_questions
from exgrpo_cli.data.templates import get_template
from exgrpo_cli.evaluation.validate import sample_and_grade
from exgrpo_cli.metrics import MetricLogger
from exgrpo_cli.policy import checkpoint as ckpt
from exgrpo_cli.policy import distributed as D
from exgrpo_cli.policy.model import load_model, load_tokenizer, pick_device
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.schedule import DelayedStart
from exgrpo_cli.reward import RewardScorer
from exgrpo_cli.rollout import build_engine
from exgrpo_cli.rollout.base import SamplingSpec
from exgrpo_cli.train.loop import Trainer

log = logging.getLogger(__name__)


class StopRequested:
    """Turns SIGINT/SIGTERM into a flag checked at step boundaries (a second signal aborts)."""

    def __init__(self) -> None:
        self.flag = False
        self._old = {}

    def __enter__(self) -> StopRequested:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame) -> None:  # noqa: ANN001
        if self.flag:
            raise KeyboardInterrupt
        self.flag = True
        log.warning("signal %s: saving a checkpoint at the end of this step", signum)

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        for sig, old in self._old.items():
            signal.signal(sig, old)


def resolve_resume(cfg: ExgrpoConfig) -> Path | None:
    out = Path(cfg.trainer.output_dir)
    root = out / "checkpoints"
    r = cfg.trainer.resume
    if r == "auto":
        return ckpt.latest_checkpoint(root)
    if r == "never":
        if ckpt.complete_checkpoints(root) and not cfg.trainer.overwrite:
            raise SystemExit(
                f"exgrpo train: {out} already holds checkpoints; trainer.resume=never refuses "
                "to overwrite them (set trainer.overwrite=true, or resume=auto)"
            )
        if root.exists():  # overwrite=true: the old run's checkpoints must not mix with the new ones
            shutil.rmtree(root)
        return None
    path = Path(r)
    if not (path / "COMPLETE").is_file():
        raise SystemExit(f"exgrpo train: trainer.resume={r} is not a complete checkpoint folder")
    return path


def make_optimizer(cfg: ExgrpoConfig, model) -> torch.optim.Optimizer:  # noqa: ANN001
    a = cfg.algo
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=a.lr,
        weight_decay=a.weight_decay,
        betas=tuple(a.betas),
    )


class _NoLogger:
    """What ranks other than 0 log to: nothing (rank 0 logs the all-reduced metrics)."""

    wandb_id = None

    def print(self, msg: str) -> None:
        log.info(msg)

    def log(self, step: int, metrics: dict) -> None:
        pass

    def close(self) -> None:
        pass


def run_training(cfg: ExgrpoConfig) -> dict[str, float]:
    t0 = time.time()
    # torchrun: one process per device, all running this function; without torchrun: one rank
    dist = D.init_distributed(timeout_s=cfg.trainer.dist_timeout_s, device=cfg.trainer.device)
    if dist.distributed and cfg.algo.questions_per_step % dist.world_size:
        raise SystemExit(
            f"exgrpo train: algo.questions_per_step={cfg.algo.questions_per_step} must be a "
            f"multiple of the {dist.world_size} ranks (each trains on an equal share)"
        )
    cfg = _share_run_dir(cfg, dist)
    out = Path(cfg.trainer.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    resume_from, refusal = None, None
    if dist.is_main:  # rank 0 alone may delete stale checkpoints; the others learn its decision
        try:
            resume_from = resolve_resume(cfg)
        except SystemExit as err:
            refusal = str(err)
    resume_from, refusal = D.broadcast_object((resume_from, refusal), dist)
    if refusal:
        raise SystemExit(refusal)
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    device = dist.device if dist.distributed else pick_device(cfg.trainer.device)
    if device.type == "cuda" and cfg.model.dtype != "float32" and dist.is_main:
        _warn_low_precision_weights(cfg)
    random.seed(cfg.trainer.seed)
    np.random.seed(cfg.trainer.seed % 2**32)
    torch.manual_seed(cfg.trainer.seed)

    train_qs, val_qs, report = load_questions(cfg.data)
    if cfg.trainer.val_questions:
        val_qs = val_qs[: cfg.trainer.val_questions]
    model_cfg = cfg.model
    if resume_from is not None:  # weights come from the checkpoint; everything else from the config
        model_cfg = dataclasses.replace(cfg.model, path=str(resume_from / "model"), gguf_file="")
    tokenizer = load_tokenizer(model_cfg)
    model = load_model(model_cfg, device)
    # shard before the optimizer is built: fully_shard swaps the parameters for DTensors
    model = D.wrap_fsdp2(model, dist, mixed_precision=cfg.trainer.fsdp_mixed_precision or None)
    template = get_template(cfg.model.template)
    train_qs = _filter_long(train_qs, template, tokenizer, cfg.model.max_prompt_tokens, report)
    optimizer = make_optimizer(cfg, model)
    sampler = QuestionSampler(train_qs, cfg.trainer.seed)
    buffer = ExperienceBuffer(cfg.rollout.n, cfg.replay.bucket_edges, cfg.replay.max_experiences)
    switch = DelayedStart(cfg.replay.start_threshold)
    start_step, wandb_id = 0, None
    if resume_from is not None:
        state = ckpt.read_json(resume_from / "trainer_state.json")
        if dist.distributed:  # the files hold the full state; each rank keeps its shard of it
            D.load_full_optimizer_state_dict(
                model, optimizer, ckpt.optimizer_state_from_files(resume_from) if dist.is_main else {}, dist
            )
        else:
            ckpt.optimizer_from_files(optimizer, resume_from)
        sampler.load_state_dict(state["sampler"])
        switch.load_state_dict(state["delayed_start"])
        buffer = ExperienceBuffer.load(str(resume_from / "replay"))
        _restore_rngs(state, resume_from)
        start_step, wandb_id = int(state["step"]), state.get("wandb_id")

    engine = build_engine(cfg, model, tokenizer)
    scorer = RewardScorer(requires_think=template.requires_think, workers=1)
    logger = (
        MetricLogger(
            str(out),
            cfg.logger,
            dataclasses.asdict(cfg),
            cfg.trainer.steps,
            start_step=start_step,
            wandb_id=wandb_id,
        )
        if dist.is_main
        else _NoLogger()
    )
    trainer = Trainer(
        cfg, model, tokenizer, template, engine, scorer, optimizer, sampler, buffer, switch, dist=dist
    )
    if resume_from is not None:
        trainer.skipped_in_a_row = int(state.get("skipped_in_a_row", 0))
        logger.print(f"resumed from {resume_from} (step {start_step})")
    logger.print(
        f"model {cfg.model.preset} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params) "
        f"on {device} x{dist.world_size}; {len(train_qs)} training / {len(val_qs)} held-out "
        "questions; "
        f"replay.ratio={cfg.replay.ratio}; output {out}"
    )

    def validate(step: int) -> dict[str, float]:
        spec = SamplingSpec(
            cfg.rollout.temperature,
            cfg.rollout.top_p,
            cfg.model.max_response_tokens,
            seed=cfg.trainer.seed * 1000003 + 7,
        )  # the same samples' seed at every eval
        res = sample_and_grade(
            engine, tokenizer, template, val_qs, scorer, n=cfg.trainer.val_samples, spec=spec
        )
        return {"val/accuracy": res.accuracy, f"val/pass@{cfg.trainer.val_samples}": res.pass_at_n}

    def save(step: int) -> Path | None:
        # collectives first, on every rank; then rank 0 alone writes
        weights = D.full_state_dict(model, dist) if dist.distributed else None
        optim_state = D.full_optimizer_state_dict(model, optimizer, dist)
        if not dist.is_main:
            D.barrier(dist)
            return None

        def write(tmp: Path) -> None:
            model.save_pretrained(tmp / "model", safe_serialization=True, state_dict=weights)
            tokenizer.save_pretrained(tmp / "model")
            ckpt.optimizer_state_to_files(optim_state, tmp)
            buffer.save(str(tmp / "replay"))
            save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
            ckpt.write_json(
                tmp / "trainer_state.json",
                {
                    "step": step,
                    "sampler": sampler.state_dict(),
                    "delayed_start": switch.state_dict(),
                    "wandb_id": logger.wandb_id,
                    "python_random": _py_rng_state(),
                    "numpy_random": _np_rng_state(),
                    "seed": cfg.trainer.seed,
                    "skipped_in_a_row": trainer.skipped_in_a_row,
                },
            )

        path = ckpt.save_checkpoint(out / "checkpoints", step, write, cfg.trainer.keep_checkpoints)
        D.barrier(dist)  # nobody reads or deletes checkpoints while rank 0 writes one
        return path

    final: dict[str, float] = {}
    try:
        if start_step == 0 and val_qs:
            first = validate(0)
            logger.log(0, {**first, "data/skipped_rows": float(report.skipped)})
            final["val/accuracy@0"] = first["val/accuracy"]
        with StopRequested() as stop:
            for step in range(start_step + 1, cfg.trainer.steps + 1):
                metrics = D.all_reduce_dict(trainer.train_step(step), dist)  # run-wide means
                last = step == cfg.trainer.steps
                e = cfg.trainer.eval_every
                if val_qs and (last or (e and step % e == 0)):
                    metrics.update(validate(step))
                logger.log(step, metrics)
                final.update({k: v for k, v in metrics.items() if k.startswith("val/")})
                give_up = trainer.skipped_in_a_row >= cfg.trainer.max_skipped_steps
                # a signal may reach one rank only: all ranks stop at the same step
                stop.flag = bool(D.all_reduce_dict({"stop": float(stop.flag)}, dist, op="max")["stop"])
                se = cfg.trainer.save_every
                if last or stop.flag or give_up or (se and step % se == 0):
                    save(step)
                if give_up:
                    raise SystemExit(
                        f"exgrpo train: {trainer.skipped_in_a_row} updates in a row were "
                        "skipped (non-finite loss or gradient); the last good state is saved"
                    )
                if stop.flag:
                    logger.print(f"stopped at step {step}; resume with the same command")
                    break
    finally:
        logger.close()
        scorer.close()
        engine.close()
        D.close_distributed()
    final["time/total_s"] = time.time() - t0
    return final


def _warn_low_precision_weights(cfg: ExgrpoConfig) -> None:
    """bf16 keeps 8 bits of mantissa: an AdamW step of ~lr on a weight of ~1e-2 rounds away when
    lr is 1e-6 (the paper's), so bf16 *weights* may not train at all. Mixed precision keeps fp32
    master weights and computes in bf16; say so once, at start-up, where it is still cheap to fix."""
    msg = (
        f"model.dtype={cfg.model.dtype}: the trained weights themselves are {cfg.model.dtype}; "
        f"updates below ~1/256 of a weight round away (algo.lr={cfg.algo.lr:g}). For training prefer "
        "model.dtype=float32 trainer.fsdp_mixed_precision=bf16 (fp32 master weights, bf16 compute "
        "and vLLM) under torchrun"
    )
    log.warning(msg)
    print(f"exgrpo train: warning: {msg}", file=sys.stderr)


def _share_run_dir(cfg: ExgrpoConfig, dist: D.DistInfo) -> ExgrpoConfig:
    """torchrun: each rank resolved Hydra's timestamped run dir on its own, and start-up skew can
    put two ranks a second apart, i.e. in two dirs. Rank 0's is the run's: the others adopt it,
    write their log to `<its hydra dir>/<job>.rank<k>.log`, and remove the stray dir Hydra made
    for them when it holds nothing but Hydra's own files."""
    if not dist.distributed:
        return cfg
    own = _hydra_dir()
    out0, hydra0 = D.broadcast_object((cfg.trainer.output_dir, own), dist)
    if dist.is_main or own is None or hydra0 is None:
        return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=out0))
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        name = Path(h.baseFilename)
        if name.parent != Path(own):
            continue
        new = logging.FileHandler(Path(hydra0) / f"{name.stem}.rank{dist.rank}{name.suffix}")
        new.setFormatter(h.formatter)
        new.setLevel(h.level)
        root.removeHandler(h)
        h.close()
        root.addHandler(new)
    stray = Path(own)
    if stray.resolve() not in (Path(hydra0).resolve(), Path(out0).resolve()) and stray.is_dir():
        hydra_only = all(p.name == ".hydra" or p.suffix == ".log" for p in stray.iterdir())
        if hydra_only:
            shutil.rmtree(stray, ignore_errors=True)
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=out0))


def _hydra_dir() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.output_dir
    except (ImportError, ValueError):  # called outside @hydra.main (e.g. from a test)
        return None


def _filter_long(questions, template, tokenizer, limit: int, report):  # noqa: ANN001, ANN202
    kept = []
    for q in questions:
        n = len(tokenizer(template.render(q, tokenizer), add_special_tokens=False)["input_ids"])
        if n <= limit:
            kept.append(q)
        else:
            report.skip(f"{q.uid}: prompt of {n} tokens > model.max_prompt_tokens={limit}", False)
    if not kept:
        raise SystemExit(f"exgrpo train: every prompt is longer than model.max_prompt_tokens={limit}")
    return kept


def _py_rng_state() -> list:
    version, state, gauss = random.getstate()
    return [version, list(state), gauss]


def _np_rng_state() -> dict:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "name": name,
        "keys": keys.tolist(),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def _restore_rngs(state: dict, folder: Path) -> None:
    v, s, g = state["python_random"]
    random.setstate((v, tuple(s), g))
    n = state["numpy_random"]
    keys = np.array(n["keys"], dtype=np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(load_file(str(folder / "rng.safetensors"))["torch"])
