"""A stand-in for vLLM 0.32 that records what exgrpo asks of it, for the tests that prove on a CPU
what the engine does on CUDA (tests/rollout/test_vllm_standin.py, test_vllm_ranks.py).

It keeps the rules of the real calls that the engine depends on:
- `LLM(distributed_executor_backend="external_launcher")` runs in-process only, takes the rank and
  the device index from RANK / LOCAL_RANK, and all-reduces every rank's free memory over the
  trainer's process group (vllm/v1/executor/uniproc_executor.py, ExecutorWithExternalLauncher);
  without that backend, the one worker lands on device 0 (UniProcExecutor._distributed_args);
- the worker extension is mixed into the worker and `collective_rpc` calls it in-process;
- the model runner's `reload_weights(weights_iterator=...)` consumes an iterator;
- `sleep(level)` / `wake_up(tags)` as `LLM.sleep` / `LLM.wake_up`.

Every call is appended to `EVENTS` (plain data: the multi-rank worker dumps it as JSON).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

__version__ = "0.32.0+standin"

EVENTS: list[dict[str, Any]] = []

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class SamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.n = int(kwargs.get("n", 1))
        self.seed = kwargs.get("seed")
        self.max_tokens = int(kwargs.get("max_tokens", 16))


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


class LLM:
    def __init__(self, **kwargs: Any) -> None:
        env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "VLLM_ENABLE_V1_MULTIPROCESSING")}
        event: dict[str, Any] = {
            "call": "LLM",
            "kwargs": {k: _plain(v) for k, v in kwargs.items()},
            "env": env,
        }
        if kwargs.get("distributed_executor_backend") == "external_launcher":
            assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0", "external_launcher runs in-process only"
            event["device_index"] = int(os.environ["LOCAL_RANK"])
            # the start-up collective: the smallest free memory over all ranks (a rank that does not
            # build its engine now leaves the others waiting here)
            free = torch.tensor([1000 + int(os.environ["RANK"])], dtype=torch.int64)
            torch.distributed.all_reduce(free, op=torch.distributed.ReduceOp.MIN)
            event["free_memory_min"] = int(free.item())
        else:
            event["device_index"] = 0
        EVENTS.append(event)
        self.kwargs = kwargs
        dtype = DTYPES.get(str(kwargs.get("dtype")), torch.bfloat16)
        self.llm_engine = SimpleNamespace(
            model_config=SimpleNamespace(dtype=dtype),
            engine_core=SimpleNamespace(shutdown=lambda: EVENTS.append({"call": "shutdown"})),
        )
        module, _, name = str(kwargs["worker_extension_cls"]).rpartition(".")
        extension = getattr(importlib.import_module(module), name)
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        worker_cls = type("Worker", (extension,), {})
        self.worker = worker_cls()
        self.worker.model_runner = GPUModelRunner()

    def generate(self, prompts: list[Any], params: list[SamplingParams], use_tqdm: bool = True) -> list[Any]:
        EVENTS.append(
            {
                "call": "generate",
                "prompts": [list(p["prompt_token_ids"]) for p in prompts],
                "n": [p.n for p in params],
                "seeds": [p.seed for p in params],
            }
        )
        return [_output(list(p["prompt_token_ids"]), sp) for p, sp in zip(prompts, params)]

    def collective_rpc(
        self, method: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def reset_prefix_cache(self) -> bool:
        EVENTS.append({"call": "reset_prefix_cache"})
        return True

    def sleep(self, level: int = 1) -> None:
        EVENTS.append({"call": "sleep", "level": level})

    def wake_up(self, tags: list[str] | None = None) -> bool:
        EVENTS.append({"call": "wake_up", "tags": tags})
        return True


def _output(prompt: list[int], sp: SamplingParams) -> Any:
    """n completions of 3 tokens that depend on the prompt, the seed and the sample's index."""
    base = sum(prompt) + (sp.seed or 0)
    outs = []
    for k in range(sp.n):
        toks = [3 + (base + k + t) % 50 for t in range(min(3, sp.max_tokens))]
        logprobs = [{tok: SimpleNamespace(logprob=-0.5)} for tok in toks]
        outs.append(SimpleNamespace(index=k, token_ids=toks, logprobs=logprobs, finish_reason="length"))
    return SimpleNamespace(outputs=outs)


def received(events: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    """The tensors that reached the model runner, in order."""
    return (e for e in (EVENTS if events is None else events) if e["call"] == "load")
