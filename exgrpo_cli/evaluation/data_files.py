"""The benchmark files of an eval run, made present and checked before the suite is read.

Where it sits: the first step of `exgrpo eval` (benchmarks.load_suite calls `prepare`), before any
file is parsed and before any model loads. The paper's files are pinned (data/pinned.py): in the
per-user cache (eval.data_dir's default) a missing one is fetched (data/fetch.py) and a present one
must verify; a folder of the user's own (an explicit eval.data_dir) is read as it is, with a warning
for a file that is not the official one (its scores are then not the paper's benchmark), and is
written only when the command asks for it (eval.data_url or eval.fetch_only), which fetches the
files it lacks and leaves the ones it has as they are.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exgrpo_cli.data.fetch import Progress, ensure, mismatch, offline, source_url
from exgrpo_cli.data.pinned import PINNED, PinnedFile, is_cache, resolve_cache_path, resolve_data_dir

if TYPE_CHECKING:
    from exgrpo_cli.config.schema import ExgrpoConfig

log = logging.getLogger(__name__)


def pinned_files(files: list[str]) -> list[PinnedFile]:
    """The pinned ones among the files the benchmarks read, each once, in the run's order."""
    return [PINNED[n] for n in dict.fromkeys(f for f in files if f in PINNED)]


def fetches(cfg: ExgrpoConfig) -> bool:
    """Whether this run may write into eval.data_dir: the cache always; a folder of the user's own
    only when asked (a mirror, or fetch-only)."""
    e = cfg.eval
    return is_cache(e.data_dir) or bool(e.data_url) or e.fetch_only


def prepare(cfg: ExgrpoConfig, files: list[str], leave_offline_missing: bool = False) -> list[Path]:
    """Fetch what is missing (where allowed) and check what is there; returns the files' paths.
    Raises FetchError (exit 2, one line) for a download that fails or a cached file that does not
    verify; a missing file in a folder exgrpo does not write is left to the caller's message, and
    so, with `leave_offline_missing`, is one that an offline machine cannot fetch (the eval's
    check_data then names every missing file at once)."""
    folder_s = resolve_data_dir(cfg.eval.data_dir)
    if not folder_s:
        return []
    folder = Path(folder_s)
    own = not is_cache(cfg.eval.data_dir)
    out = []
    for pinned in pinned_files(files):
        path = folder / pinned.name
        if own and path.is_file():  # the user's own copy, whatever this run may fetch: used, not refused
            _warn_if_foreign(path, pinned)
            out.append(path)
        elif fetches(cfg) and not (leave_offline_missing and _unfetchable(cfg, path)):
            with _progress(pinned, folder, cfg.eval.data_url) as tick:
                out.append(ensure(pinned, folder, cfg.eval.data_url, cfg.eval.fetch_timeout_s, tick))
    return out


def _unfetchable(cfg: ExgrpoConfig, path: Path) -> bool:
    """A missing file on an offline machine without a mirror: `ensure` would only refuse it."""
    return not path.is_file() and offline() and not cfg.eval.data_url


def _warn_if_foreign(path: Path, pinned: PinnedFile) -> None:
    why = mismatch(path, pinned)
    if why:  # used, but never silently
        line = (
            f"warning: {path} is not the official {pinned.name} ({why}): its scores are not the "
            "paper's benchmark"
        )
        log.warning(line)
        print(line, file=sys.stderr)


class _Bar:
    """A download bar on a terminal, started by the first byte count; one line in a log. Says
    nothing for a file already there (no byte count comes)."""

    def __init__(self, pinned: PinnedFile, folder: Path, mirror: str) -> None:
        from rich.console import Console

        self.pinned, self.folder, self.mirror = pinned, folder, mirror
        self.console = Console(stderr=True)
        self.started = False
        self.bar: Any = None  # rich.progress.Progress on a terminal
        self.task: Any = None

    def tick(self, done: int, total: int) -> None:
        if not self.started:
            self.started = True
            if self.console.is_terminal:
                from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

                name = self.pinned.name
                self.bar = Progress(
                    TextColumn(f"fetching {name}"), BarColumn(), DownloadColumn(), console=self.console
                )
                self.bar.start()
                self.task = self.bar.add_task(name, total=total)
            else:
                url = source_url(self.pinned, self.mirror)
                self.console.print(
                    f"fetching {self.pinned.name} ({total} bytes) from {url} into {self.folder}",
                    highlight=False,
                    soft_wrap=True,
                )
        if self.bar is not None:
            self.bar.update(self.task, completed=done)


@contextmanager
def _progress(pinned: PinnedFile, folder: Path, mirror: str) -> Iterator[Progress]:
    bar = _Bar(pinned, folder, mirror)
    try:
        yield bar.tick
    finally:
        if bar.bar is not None:
            bar.bar.stop()


def pinned_val_file(cfg: ExgrpoConfig) -> PinnedFile | None:
    """The pinned file `data.val_path` names, when it names one in eval.data_dir (the paper
    recipes' `${eval.data_dir}/valid.parquet`); None for any other held-out file."""
    val = cfg.data.val_path
    folder = resolve_data_dir(cfg.eval.data_dir)
    if not val or not folder or Path(val).name not in PINNED:
        return None
    in_folder = Path(resolve_cache_path(val)).expanduser().parent == Path(folder)
    return PINNED[Path(val).name] if in_folder else None


def prepare_val_path(cfg: ExgrpoConfig) -> Path | None:
    """The training side of the cache: the paper recipes' held-out file fetched (or verified) as
    the eval's files are, before the training data is read; None when data.val_path is another file."""
    pinned = pinned_val_file(cfg)
    if pinned is None:
        return None
    files = prepare(cfg, [pinned.name])
    return files[0] if files else None
