"""What a run reads from the Hugging Face hub, fetched ahead into the hub's own caches.

Where it sits: only in the fetch-only mode (`trainer.fetch_only` / `eval.fetch_only`, run on a
login node that has network), before anything loads; a compute node then runs with
HF_HUB_OFFLINE=1 and finds everything in the caches that `datasets` and `huggingface_hub` read by
default. Each failure is one line naming what could not be fetched (a UsageError, exit 2).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from exgrpo_cli.errors import UsageError

# Llama repositories carry a second copy of the weights for Meta's own code (original/*.pth,
# 16 GB for 8B); transformers and vLLM read the safetensors.
IGNORED = ["original/*"]


def is_hub_id(path: str) -> bool:
    """A model path the hub serves: not builtin:, pypi:, or a local folder."""
    if path.startswith(("builtin:", "pypi:", "/", ".", "~")) or Path(path).expanduser().exists():
        return False
    return path.count("/") == 1


def fetch_model(repo_id: str) -> str:
    """The model's files in the hub cache (huggingface_hub.snapshot_download); its local folder."""
    from huggingface_hub import snapshot_download

    try:
        return str(snapshot_download(repo_id, ignore_patterns=IGNORED))
    except Exception as err:  # offline, gated, no such repo: all one refusal to the user
        raise UsageError(
            f"cannot fetch the model {repo_id} from the Hugging Face hub ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}): run the fetch on a machine with network "
            "(and `huggingface-cli login` for a gated model)"
        ) from None


def fetch_dataset(name: str, split: str) -> int:
    """A hub dataset's split into the `datasets` cache; its row count."""
    try:
        datasets = importlib.import_module("datasets")
    except ImportError:
        raise UsageError(
            f"the hub dataset {name} needs the `datasets` package (make install-gpu brings it, or "
            "pip install datasets)"
        ) from None
    try:
        return len(datasets.load_dataset(name, split=split))
    except Exception as err:
        raise UsageError(
            f"cannot fetch the dataset {name} (split {split}) from the Hugging Face hub "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}): run the fetch "
            "on a machine with network"
        ) from None
