"""Expensive artefacts that many tests only read (a short trained run, its checkpoint), built once
per test run and shared: by every test of a plain `pytest`, and by every worker of `pytest -n N`
(pytest-xdist), where the first worker to ask builds it under a file lock and the others wait for
it and then read the same folder.

A test that reads a shared artefact must not write into it: one that needs to change it (a
corrupted file, a resumed run) copies it to its own tmp_path first (`private_copy`).
"""

from __future__ import annotations

import fcntl
import shutil
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

BUILT = ".built"  # beside the artefact's folder, written once the build finished
FAILED = ".failed"  # beside it too: the first build's error, so that other workers do not retry


def session_root(request: pytest.FixtureRequest) -> Path:
    """A folder shared by every process of this test run: the run's base temp folder, which under
    pytest-xdist is the parent of each worker's own (<basetemp>/popen-gwN). A worker is told by its
    config (`workerinput`), not by the environment, which a pytest started inside a test inherits."""
    base = request.getfixturevalue("tmp_path_factory").getbasetemp()
    root = base.parent if hasattr(request.config, "workerinput") else base
    shared = root / "shared-artefacts"
    shared.mkdir(exist_ok=True)
    return shared


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes, also if the process dies
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_once(root: Path, name: str, build: Callable[[Path], None]) -> Path:
    """`root/name`, built by `build(folder)` the first time any process of the run asks for it.

    The folder is built where it stays (a run dir records its own path), so a build that failed
    leaves `name.failed` with its error: every later request fails with it at once rather than
    spending the build's minutes again."""
    folder, built, failed = root / name, root / f"{name}{BUILT}", root / f"{name}{FAILED}"
    with _locked(root / f"{name}.lock"):
        if built.exists():
            return folder
        if failed.exists():
            pytest.fail(f"the shared {name} failed to build earlier in this run:\n{failed.read_text()}")
        shutil.rmtree(folder, ignore_errors=True)
        try:
            build(folder)
        except (Exception, pytest.fail.Exception) as err:  # pytest.fail's is a BaseException
            failed.write_text(f"{type(err).__name__}: {err}\n{traceback.format_exc()[-4000:]}")
            raise
        built.write_text("")
    return folder


def private_copy(folder: Path, dest: Path) -> Path:
    """A copy of a shared artefact that a test may change: `dest`, with the same files."""
    shutil.copytree(folder, dest, symlinks=True)
    return dest
