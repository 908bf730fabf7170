"""`trainer.fetch_only=true` / `eval.fetch_only=true`: download everything a command will read into
the caches, say where it is, and exit, without loading any model.

Where it sits: instead of the run, after the config is validated. Meant for a login node with
network: a compute node then runs the same command (without fetch_only) with HF_HUB_OFFLINE=1 and
finds the benchmark files in eval.data_dir, the hub datasets in the `datasets` cache and the
weights in the hub cache. Everything is fetched in one go; the first failure stops with one line
(exit 2), and what was fetched before it stays in the caches.
"""

from __future__ import annotations

from pathlib import Path

from exgrpo_cli.config.schema import ExgrpoConfig


def _say(line: str) -> None:
    print(f"fetch-only: {line}", flush=True)


def _pinned(path: Path) -> None:
    """A prepared benchmark file; one of the user's own folder may be kept unofficial (warned)."""
    from exgrpo_cli.data.fetch import mismatch
    from exgrpo_cli.data.pinned import PINNED

    official = mismatch(path, PINNED[path.name]) is None
    _say(f"{path.name}: {path} ({'sha256 verified' if official else 'yours, not the official file: kept'})")


def _models(paths: list[str]) -> None:
    from exgrpo_cli.data.hub import fetch_model, is_hub_id

    for path in dict.fromkeys(paths):
        if is_hub_id(path):
            _say(f"model {path}: {fetch_model(path)}")
        else:
            _say(f"model {path}: not a hub id, nothing to fetch")


def fetch_for_eval(cfg: ExgrpoConfig) -> None:
    """The suite's pinned files into eval.data_dir, MMLU-Pro's hub split (unless its file is
    there), and the weights of every model of the run."""
    import dataclasses

    from exgrpo_cli.data.hub import fetch_dataset
    from exgrpo_cli.data.pinned import resolve_data_dir
    from exgrpo_cli.evaluation.benchmarks import resolve
    from exgrpo_cli.evaluation.data_files import prepare

    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, fetch_only=True))
    benches = resolve(cfg)
    for path in prepare(cfg, [b.file for b in benches]):
        _pinned(path)
    folder = resolve_data_dir(cfg.eval.data_dir)
    for b in benches:
        if b.hf_id and not (folder and (Path(folder) / b.file).is_file()):
            _say(f"{b.title}: {fetch_dataset(b.hf_id, b.hf_split)} rows of {b.hf_id} ({b.hf_split})")
    _models(list(cfg.eval.compare) or [cfg.model.path])


def fetch_for_train(cfg: ExgrpoConfig) -> None:
    """The held-out file of the paper recipes, a hub training set, and the model's weights."""
    import dataclasses

    from exgrpo_cli.data.hub import fetch_dataset
    from exgrpo_cli.evaluation.data_files import prepare_val_path

    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, fetch_only=True))
    val = prepare_val_path(cfg)
    if val is not None:
        _pinned(val)
    d = cfg.data
    if d.source == "hf":
        _say(f"training data: {fetch_dataset(d.path, d.split)} rows of {d.path} ({d.split})")
    _models([cfg.model.path])
