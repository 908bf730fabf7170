"""`exgrpo train`: one RL run (ExGRPO, or on-policy Dr.GRPO with replay.ratio=0).

Before anything loads, the memory plan (exgrpo_cli/plan): `trainer.dry_run=true` prints it for
`trainer.plan_devices` (or the visible devices) and stops, exit 0 when it fits and 2 when not; a
GPU run prints it for its own GPUs and refuses to start when it does not fit; a CPU run writes it
to the log. Every real run first finds its model's architecture from files, which also stops a
model that cannot be fetched within seconds, with one message.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from exgrpo_cli.config.checks import validate
from exgrpo_cli.config.schema import ExgrpoConfig, ModelConfig, TrainerConfig
from exgrpo_cli.errors import ExgrpoError, SaidElsewhere, UsageError, exit_on_error

if TYPE_CHECKING:
    from exgrpo_cli.plan import Devices, Plan

log = logging.getLogger(__name__)


def run(cfg: ExgrpoConfig) -> None:
    from exgrpo_cli.run.launch import launch, launched_rank, resolve_nproc

    main = launched_rank() == 0  # under torchrun every rank runs this; rank 0 reports
    if cfg.trainer.fetch_only:  # a login node: data, held-out file and weights into the caches
        from exgrpo_cli.commands.fetch_only import fetch_for_train

        fetch_for_train(cfg)
        return
    if not cfg.trainer.dry_run:  # the paper recipes' cached held-out file, fetched before anything loads
        from exgrpo_cli.checkpoint.store import check_root
        from exgrpo_cli.evaluation.data_files import prepare_val_path

        # a run dir whose checkpoints/ links elsewhere: refused before the plan reads through it
        check_root(Path(cfg.trainer.output_dir) / "checkpoints")

        prepare_val_path(cfg)
    nproc = resolve_nproc(cfg)  # before the plan: it plans for the ranks this command starts
    memory_preflight(cfg, nproc, main)
    if cfg.trainer.dry_run:
        return
    if nproc > 1:  # the whole node from one command; this process only waits for the ranks
        final = launch(cfg, nproc, rank_main) or {}
    else:
        from exgrpo_cli.run.training import run_training

        final = run_training(cfg)
    if not main or not final:  # stopped ranks reported already
        return
    parts = [f"{k}={v:.4f}" for k, v in sorted(final.items())]
    print("exgrpo train done: " + "  ".join(parts))


def rank_main(cfg: ExgrpoConfig) -> dict[str, float]:
    """What every rank `trainer.nproc` starts runs (in a fresh process): rank 0 says an error, each
    rank exits with its code; a crash's traceback goes to the rank's log (the parent says which
    rank failed)."""
    from exgrpo_cli.run.launch import launched_rank, rank_crashed, rank_logging
    from exgrpo_cli.run.training import run_training

    out, rank = Path(cfg.trainer.output_dir), launched_rank()
    out.mkdir(parents=True, exist_ok=True)
    with exit_on_error("train"):  # a refused log file: every rank says its own
        rank_logging(out)
    with exit_on_error("train", say=rank == 0):
        try:
            return run_training(cfg)
        except ExgrpoError:
            raise
        except Exception:
            log.exception("rank %s failed", rank)
            raise rank_crashed() from None


def weights_source(cfg: ExgrpoConfig) -> ModelConfig:
    """Where the run will load its weights from: the checkpoint it resumes (found as
    run/setup.py finds it, read-only here), else `model.path`."""
    from exgrpo_cli.checkpoint.store import latest_checkpoint

    t = cfg.trainer
    if t.resume == "never":
        return cfg.model
    ckpt = latest_checkpoint(Path(t.output_dir) / "checkpoints") if t.resume == "auto" else Path(t.resume)
    if ckpt is not None and (ckpt / "model" / "config.json").is_file():
        return dataclasses.replace(cfg.model, path=str(ckpt / "model"), gguf_file="")
    return cfg.model


def memory_preflight(cfg: ExgrpoConfig, nproc: int = 1, main: bool = True) -> None:
    """The plan's part of start-up, after validation and before `run_training`; raises a
    UsageError (exit 2) for a run that cannot start. `main`: rank 0 (or the only process), which
    shows the plan and says the refusal."""
    from exgrpo_cli import plan
    from exgrpo_cli.plan.inputs import uses_cuda

    t = cfg.trainer
    if t.dry_run:  # offline: the preset's numbers will do, no weights are needed
        check_data_here(cfg)
        arch = plan.resolve_architecture(cfg.model, offline_ok=True)
        devices = planned(t) if t.plan_devices else plan.visible_devices(cfg, nproc)
        plan.check_memory(cfg, arch, devices, verify=verifier(cfg, devices))
        return
    # the weights must be reachable: fail in seconds, not after a minute of hub retries
    arch = plan.resolve_architecture(weights_source(cfg), offline_ok=False)
    devices = plan.visible_devices(cfg, nproc if nproc > 1 else 0)
    if not uses_cuda(cfg):  # a CPU run: the plan goes to the log and never refuses
        plan.check_memory(cfg, arch, devices, echo=log.info, refuse=False)
        return
    try:
        plan.check_memory(cfg, arch, devices, echo=print if main else log.info, verify=verifier(cfg, devices))
    except plan.PlanDoesNotFit:
        if not main:  # every rank refuses; rank 0 says why
            raise SaidElsewhere(2) from None
        raise


def data_problems(cfg: ExgrpoConfig) -> list[str]:
    """What the run's data lacks on this machine, all at once: the held-out file, the benchmark
    folder, and the `datasets` package a hub source needs (a local data.path is checked by
    validation already)."""
    import importlib.util

    from exgrpo_cli.data.fetch import offline
    from exgrpo_cli.data.pinned import is_cache, resolve_data_dir
    from exgrpo_cli.evaluation.data_files import fetches, pinned_val_file

    d, problems = cfg.data, []
    # the cache's own valid.parquet is fetched at start when absent: a problem only offline
    fetched = pinned_val_file(cfg) is not None and fetches(cfg) and (bool(cfg.eval.data_url) or not offline())
    if d.val_path and not Path(d.val_path).expanduser().is_file() and not fetched:
        problems.append(
            f"data.val_path={d.val_path}: no such file (the paper recipes read valid.parquet from "
            "eval.data_dir: docs/evaluation.md#benchmark-data)"
        )
    folder = resolve_data_dir(cfg.eval.data_dir)
    if folder and not is_cache(cfg.eval.data_dir) and not Path(folder).is_dir():
        problems.append(f"eval.data_dir={cfg.eval.data_dir}: no such folder")
    if d.source == "hf" and importlib.util.find_spec("datasets") is None:
        problems.append(
            f"data.source=hf ({d.path}) needs the `datasets` package: make install-gpu brings it, "
            "or pip install datasets"
        )
    return problems


def check_data_here(cfg: ExgrpoConfig) -> None:
    """A dry run checks the data as the run would find it here: refused (exit 2) when it plans this
    machine; only a warning when it plans another (trainer.plan_devices), whose files are not here."""
    problems = data_problems(cfg)
    if not problems:
        return
    if cfg.trainer.plan_devices:  # part of the dry run's report (stdout): stderr is for refusals
        print(f"warning: not on this machine: {'; '.join(problems)}")
        return
    raise UsageError("; ".join(problems))


def planned(t: TrainerConfig) -> Devices:
    """trainer.plan_devices on nodes of trainer.plan_ranks_per_node GPUs with trainer.plan_host_gib."""
    from exgrpo_cli import plan

    return plan.planned_devices(t.plan_devices, t.plan_ranks_per_node, t.plan_host_gib)


def verifier(cfg: ExgrpoConfig, devices: Devices) -> Callable[[tuple[str, ...]], Plan | None]:
    """Plans a suggested fix from this run's typed config with the fix's `key=value` overrides
    applied, on `devices` unless the fix names others; a `model=<preset>` fix from that preset's
    composed config (its recipe comes along). None for a fix that does not apply or validate."""

    def verify(extra: tuple[str, ...]) -> Plan | None:
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        from exgrpo_cli import plan
        from exgrpo_cli.commands.compose import compose_in_app, with_overrides
        from exgrpo_cli.plan.inputs import inputs_from_config

        preset = tuple(o for o in extra if o.startswith("model="))
        try:
            base = compose_in_app(preset) if preset else cfg
            if base is None:
                log.info("suggested overrides %s: a preset is composed only in a Hydra app", extra)
                return None
            typed = with_overrides(base, [o for o in extra if o not in preset])
            validate(typed, "train")
            arch = plan.resolve_architecture(typed.model, offline_ok=True)
        except (UsageError, HydraException, OmegaConfBaseException) as err:
            log.info("suggested overrides %s do not apply: %s", extra, err)
            return None
        t = typed.trainer
        chosen = planned(t) if t.plan_devices else devices
        return plan.plan_memory(arch, inputs_from_config(typed, chosen))

    return verify
