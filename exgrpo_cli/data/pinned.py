"""The paper's data files that exgrpo knows by name, source and checksum, and the per-user cache
they are fetched into.

Where it sits: before a run reads any data. `exgrpo eval`'s benchmark loader and `exgrpo train`'s
held-out file (the paper recipes' `data.val_path`) ask `data/fetch.py` for a pinned file; it is
fetched once into `eval.data_dir` (by default `benchmark_cache_dir()`) and checked against the
size and sha256 below before anything reads it. The four files are plain git files of the official
repository at one commit, so a raw-file URL of that commit always serves the same bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from exgrpo_cli.config.commands import DEFAULT_DATA_DIR

OFFICIAL_REPO = "ElliottYan/LUFFY"
OFFICIAL_COMMIT = "01f4ae066249e6965ce0d5512ccdf99a12895c74"
RAW_BASE = f"https://raw.githubusercontent.com/{OFFICIAL_REPO}/{OFFICIAL_COMMIT}"


@dataclass(frozen=True)
class PinnedFile:
    name: str  # the file's name in eval.data_dir (and on a mirror: <eval.data_url>/<name>)
    repo_path: str  # its path in the official repository
    size: int  # bytes
    sha256: str

    @property
    def url(self) -> str:
        return f"{RAW_BASE}/{self.repo_path}"


# Measured from the official repository at OFFICIAL_COMMIT (git show <commit>:<path> | sha256sum).
PINNED: dict[str, PinnedFile] = {
    f.name: f
    for f in (
        PinnedFile(
            "test.id.parquet",
            "ExGRPO/data/test.id.parquet",
            266_345,
            "92503399b914212d2e3d85839882bc1376a0111652fec0dcb722e86307e97617",
        ),
        PinnedFile(
            "valid.parquet",
            "ExGRPO/data/valid.parquet",
            255_632,
            "7828d704c3539651f757272071c7e17cba84efe956434adceb363442b665da49",
        ),
        PinnedFile(
            "valid.arc_c.parquet",
            "data/valid.arc_c.parquet",
            192_867,
            "7c3d1df8f11ade8be258ee0b0c7bbd6ac9a8e535dee3dbb3b5410f974f0d8fe5",
        ),
        PinnedFile(
            "valid.gpqa.parquet",
            "data/valid.gpqa.parquet",
            81_095,
            "55bde3943eeb6906d6d569d0ab882638c2f395a716ab5fa1fa20a186e722e58b",
        ),
    )
}


# eval.data_dir's default as Hydra resolves it under XDG_CACHE_HOME="" (set but empty: oc.env takes
# the empty value, not its default): a folder at the root that is no one's cache
EMPTY_XDG_DATA_DIR = "/exgrpo/benchmarks"


def cache_home() -> Path:
    """$XDG_CACHE_HOME, else ~/.cache; an empty XDG_CACHE_HOME counts as unset, as the XDG spec
    says (the one rule for the eval's folder and the training's held-out file)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()


def benchmark_cache_dir() -> Path:
    """`cache_home()`/exgrpo/benchmarks: the per-user cache of the pinned files."""
    return cache_home() / "exgrpo" / "benchmarks"


def resolve_cache_path(path: str) -> str:
    """`path` with eval.data_dir's default folder written as it is here: the default unresolved
    (outside Hydra) or resolved under an empty XDG_CACHE_HOME becomes `benchmark_cache_dir()`, so
    `${eval.data_dir}/valid.parquet` (the paper recipes' data.val_path) lands in the cache too;
    any other path is returned as it is."""
    for default in (DEFAULT_DATA_DIR, EMPTY_XDG_DATA_DIR):
        if path == default or path.startswith(default + "/"):
            return str(benchmark_cache_dir()) + path[len(default) :]
    return path


def resolve_data_dir(data_dir: str) -> str:
    """`eval.data_dir` as a folder path: the default (see `resolve_cache_path`) becomes the cache
    folder, `~` is expanded; "" stays "" (no folder)."""
    if not data_dir:
        return ""
    return str(Path(resolve_cache_path(data_dir)).expanduser())


def is_cache(data_dir: str) -> bool:
    """Whether `data_dir` is the per-user cache, which exgrpo fills itself (an explicit folder is
    the user's: read as it is, written only when they ask, eval.fetch_only or eval.data_url)."""
    return bool(data_dir) and Path(resolve_data_dir(data_dir)) == benchmark_cache_dir()
