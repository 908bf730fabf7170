"""A stand-in for vLLM 0.32 that enforces what exgrpo may ask of it, as read in vLLM's released
source, and records every call, for the tests that prove on a CPU what the engine does on CUDA
(tests/rollout/test_vllm_standin.py, test_vllm_ranks.py, test_vllm_contract.py, the stand-in runs
of `exgrpo train rollout=vllm`).

Rules it keeps (a breach raises `StandInContractError` where vLLM would crash, hang or go silently
wrong):
- `LLM(distributed_executor_backend="external_launcher")` runs in-process only, takes the rank and
  the device index from RANK / LOCAL_RANK, asserts LOCAL_RANK is below the visible device count
  (`VISIBLE_DEVICES`, default: LOCAL_RANK + 1; vllm/v1/worker/gpu_worker.py), and all-reduces
  every rank's free memory over the trainer's process group (uniproc_executor.py,
  ExecutorWithExternalLauncher); without that backend, the one worker lands on device 0;
- the worker extension is mixed into the worker and `collective_rpc` calls it in-process; the
  model runner's `reload_weights(weights_iterator=...)` consumes an iterator;
- sleep and wake (entrypoints/llm.py, v1/engine/core.py, v1/executor/abstract.py,
  gpu_worker.py): `sleep` needs `enable_sleep_mode`; level 1 keeps the weights in host memory,
  level 2 discards them (a wake maps back memory that is not the weights: only a reload restores
  them); a second sleep is a no-op, as in vLLM. The scheduler is paused while anything sleeps, so
  `generate` then would wait forever: it raises. A reload while the weights sleep would write into
  unmapped memory: it raises. Waking a tag that is not asleep is a silent no-op in vLLM (a
  warning): it raises; so does waking the KV cache before the weights (the documented order is
  weights, reload, KV cache);
- with `enable_lora` the engine's linear layers are wrapped as vLLM's LoRA layers wrap them (the
  original kept as `base_layer`: their weights are named `...base_layer.weight`, vllm/lora/layers/
  base_linear.py); a reload still takes the Hugging Face names. `compilation_config` takes only
  CompilationConfig's fields; the LLM event says how many sets of CUDA graphs vLLM would capture;
- log-probs follow the weights it was last given (vllm/_weights.py): a real model when `model=`
  is an HF folder, a fingerprint of the tensors otherwise. `logprobs_mode` raw_logprobs or
  processed_logprobs (after temperature) as vLLM's.

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
# the devices this process sees (CUDA_VISIBLE_DEVICES' length on a GPU node); None: LOCAL_RANK + 1
VISIBLE_DEVICES: int | None = None
SLEEP_TAGS = ("weights", "kv_cache")


class StandInContractError(RuntimeError):
    """A call vLLM 0.32 would not survive (or would silently get wrong)."""


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FALLBACK_HEAD_DTYPE = False  # set by a test: the platform has no fp32 head (vLLM warns, falls back)


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
            local_rank = int(os.environ["LOCAL_RANK"])
            visible = VISIBLE_DEVICES if VISIBLE_DEVICES is not None else local_rank + 1
            # gpu_worker.py: assert self.local_rank < torch.accelerator.device_count()
            if local_rank >= visible:
                raise AssertionError(
                    f"DP adjusted local rank {local_rank} is out of bounds for {visible} devices."
                )
            event["device_index"] = local_rank
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
        # vLLM 0.32's ModelConfig.head_dtype: read-only, the HF config's `head_dtype` (set through
        # hf_overrides) or the model's dtype; FALLBACK_HEAD_DTYPE plays a platform that refuses fp32
        asked = (kwargs.get("hf_overrides") or {}).get("head_dtype")
        head_dtype = DTYPES[asked] if asked in DTYPES else dtype
        if FALLBACK_HEAD_DTYPE:
            head_dtype = dtype
        self.llm_engine = SimpleNamespace(
            model_config=SimpleNamespace(dtype=dtype, head_dtype=head_dtype),
            engine_core=SimpleNamespace(shutdown=lambda: EVENTS.append({"call": "shutdown"})),
        )
        module, _, name = str(kwargs["worker_extension_cls"]).rpartition(".")
        extension = getattr(importlib.import_module(module), name)
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        worker_cls = type("Worker", (extension,), {})
        self.worker = worker_cls()
        self.worker.model_runner = GPUModelRunner()
        self.worker.model_runner.owner = self
        from vllm._weights import StandInWeights

        self.weights = StandInWeights(
            str(kwargs["model"]), str(kwargs.get("load_format", "auto")), lora=bool(kwargs.get("enable_lora"))
        )
        event["cudagraph_sets"] = _cudagraph_sets(kwargs)
        self.sleeping_tags: set[str] = set()
        self.logprobs_mode = str(kwargs.get("logprobs_mode", "raw_logprobs"))

    def generate(self, prompts: list[Any], params: list[SamplingParams], use_tqdm: bool = True) -> list[Any]:
        if self.sleeping_tags:
            raise StandInContractError(
                f"generate while {sorted(self.sleeping_tags)} sleep: vLLM's scheduler is paused "
                "until every tag is awake, the requests would wait forever"
            )
        EVENTS.append(
            {
                "call": "generate",
                "prompts": [list(p["prompt_token_ids"]) for p in prompts],
                "n": [p.n for p in params],
                "seeds": [p.seed for p in params],
            }
        )
        return [self._output(list(p["prompt_token_ids"]), sp) for p, sp in zip(prompts, params)]

    def _output(self, prompt: list[int], sp: SamplingParams) -> Any:
        if self.weights.model is not None:
            samples = self.weights.sample(prompt, sp, self.logprobs_mode)
        else:
            samples = _made_up(prompt, sp, self.weights.flat_logprob())
        outs = []
        shift = _logprob_shift(sum(e["call"] == "generate" for e in EVENTS))
        for k, (toks, logps, reason) in enumerate(samples):
            logps = [lp - shift for lp in logps]
            steps = [{tok: SimpleNamespace(logprob=lp)} for tok, lp in zip(toks, logps)]
            outs.append(SimpleNamespace(index=k, token_ids=toks, logprobs=steps, finish_reason=reason))
        return SimpleNamespace(outputs=outs)

    def collective_rpc(
        self, method: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def reset_prefix_cache(self) -> bool:
        EVENTS.append({"call": "reset_prefix_cache"})
        return True

    def sleep(self, level: int = 1) -> None:
        if not self.kwargs.get("enable_sleep_mode"):
            raise StandInContractError("sleep() on an engine built without enable_sleep_mode=True")
        if level not in (1, 2):
            raise StandInContractError(f"sleep level {level}: exgrpo uses 1 or 2")
        EVENTS.append({"call": "sleep", "level": level})
        if "weights" in self.sleeping_tags:  # vLLM: "Executor is already sleeping." and nothing
            return
        self.sleeping_tags |= set(SLEEP_TAGS)
        if level == 2:
            self.weights.discard()

    def wake_up(self, tags: list[str] | None = None) -> bool:
        EVENTS.append({"call": "wake_up", "tags": tags})
        wake = set(SLEEP_TAGS if tags is None else tags)
        if not wake <= set(SLEEP_TAGS):
            raise StandInContractError(f"wake_up tags {tags}: exgrpo wakes {SLEEP_TAGS}")
        if not wake <= self.sleeping_tags:
            # vLLM logs "Tag ... is not in sleeping tags" and wakes nothing
            raise StandInContractError(f"wake_up({tags}) while only {sorted(self.sleeping_tags)} sleep")
        if "kv_cache" in wake and "weights" in self.sleeping_tags - wake:
            raise StandInContractError(
                "wake_up(kv_cache) before the weights: wake weights, reload, then KV cache"
            )
        self.sleeping_tags -= wake
        return not self.sleeping_tags


# a subset of vLLM 0.33's CompilationConfig fields (vllm/config/compilation.py); the config is a
# pydantic dataclass that refuses any other key
COMPILATION_FIELDS = frozenset(
    {
        "mode",
        "level",
        "backend",
        "custom_ops",
        "splitting_ops",
        "compile_sizes",
        "cudagraph_mode",
        "cudagraph_num_of_warmups",
        "cudagraph_capture_sizes",
        "max_cudagraph_capture_size",
        "cudagraph_copy_inputs",
        "cudagraph_specialize_lora",
        "use_inductor_graph_partition",
        "pass_config",
        "inductor_compile_config",
    }
)


def _cudagraph_sets(kwargs: dict[str, Any]) -> int:
    """How many sets of CUDA graphs vLLM captures: none when eager; with LoRA on, one with and one
    without LoRA unless compilation_config's cudagraph_specialize_lora (True by default) is off
    (v1/cudagraph_dispatcher.py: its keys per LoRA case); one otherwise."""
    config = kwargs.get("compilation_config") or {}
    if not isinstance(config, dict):
        raise StandInContractError(f"compilation_config={config!r}: exgrpo passes a dict")
    unknown = set(config) - COMPILATION_FIELDS
    if unknown:
        raise StandInContractError(f"compilation_config: CompilationConfig has no field {sorted(unknown)}")
    if kwargs.get("enforce_eager"):
        return 0
    specialize = bool(config.get("cudagraph_specialize_lora", True))
    return 2 if kwargs.get("enable_lora") and specialize else 1


# tests only: the engine reports log-probs lower than its own by SHIFT nats per token, plus DRIFT
# more at each generate call (a mismatch that grows a little every step), as floats
LOGP_SHIFT, LOGP_DRIFT = "EXGRPO_STANDIN_LOGP_SHIFT", "EXGRPO_STANDIN_LOGP_DRIFT"


def _logprob_shift(calls: int) -> float:
    return float(os.environ.get(LOGP_SHIFT, 0.0)) + calls * float(os.environ.get(LOGP_DRIFT, 0.0))


def _made_up(
    prompt: list[int], sp: SamplingParams, logprob: float
) -> list[tuple[list[int], list[float], str]]:
    """Without a model: n completions of 3 tokens that depend on the prompt, the seed and the
    sample's index, each token's log-prob a function of the weights last given."""
    base = sum(prompt) + (sp.seed or 0)
    outs = []
    for k in range(sp.n):
        toks = [3 + (base + k + t) % 50 for t in range(min(3, sp.max_tokens))]
        outs.append((toks, [logprob] * len(toks), "length"))
    return outs


def received(events: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    """The tensors that reached the model runner, in order."""
    return (e for e in (EVENTS if events is None else events) if e["call"] == "load")
