"""The vLLM engine against a stand-in `vllm` (tests/rollout/fake_vllm) that records every call and
enforces vLLM 0.32's contract (the tests at the end hold the stand-in to it: a generate, reload or
wake that vLLM would not survive raises; its log-probs follow the weights it was last given): what
the engine asks of vLLM on CUDA, checked on a CPU. `_cuda` / `_free_cuda_cache` are swapped for a
CUDA that says yes and records when torch's cache is emptied.

Proves: a one-process run builds today's engine (no external launcher, the seed as given, eager,
no sleep mode on a CPU); on CUDA the engine runs CUDA graphs, empties torch's cache right before it
starts and before every wake; the sleep/wake order (generate, release = sleep level 2, sync wakes
the weights only, generate wakes the KV cache, and syncs the dropped weights again itself when no
sync came after a release); the sync casts each floating-point tensor to the engine's dtype (an
FSDP shard before its gather) and hands them over one at a time; an old vLLM is refused before it
starts.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from exgrpo_cli.rollout import vllm_engine
from exgrpo_cli.rollout.base import Rollout, SamplingSpec
from exgrpo_cli.rollout.vllm_engine import VLLMEngine
from exgrpo_cli.rollout.vllm_launch import MP_ENV

SPEC = SamplingSpec(1.0, 1.0, 8, seed=3)


def on_cuda(monkeypatch: pytest.MonkeyPatch, fake: ModuleType) -> None:
    monkeypatch.setattr(vllm_engine, "_cuda", lambda: True)
    monkeypatch.setattr(vllm_engine, "_cuda_device", lambda: 0)
    monkeypatch.setattr(vllm_engine, "_free_cuda_cache", lambda: fake.EVENTS.append({"call": "empty_cache"}))


def calls(events: list[dict[str, Any]]) -> list[str]:
    """The calls the stand-in recorded, tensors loaded summed up as "load"."""
    out: list[str] = []
    for e in events:
        name = e["call"]
        if name == "sleep":
            name = f"sleep({e['level']})"
        elif name == "wake_up":
            name = f"wake_up({','.join(e['tags'])})"
        if name != "load" or not out or out[-1] != "load":
            out.append(name)
    return out


# a wake for a sync (the weights only), and one for a generate (the KV cache): torch's cache first
WAKE_AND_SYNC = ["empty_cache", "wake_up(weights)", "load", "reset_prefix_cache"]
WAKE_AND_GENERATE = ["empty_cache", "wake_up(kv_cache)", "generate"]


def llm_kwargs(fake: ModuleType) -> dict[str, Any]:
    (event,) = [e for e in fake.EVENTS if e["call"] == "LLM"]
    return dict(event["kwargs"], device_index=event["device_index"], env=event["env"])


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(4, 3)
        self.register_buffer("steps", torch.tensor([3]))  # not floating point: never cast


def test_one_process_builds_todays_engine(vllm: ModuleType) -> None:
    engine = VLLMEngine("some/model", [2], seed=5, sleep_mode=True)
    kw = llm_kwargs(vllm)
    assert "distributed_executor_backend" not in kw and "tensor_parallel_size" not in kw
    assert (kw["seed"], kw["device_index"], kw["env"][MP_ENV]) == (5, 0, "0")
    assert kw["enforce_eager"] is True and kw["enable_sleep_mode"] is False  # a CPU
    assert "kv_cache_memory_bytes" in kw and "gpu_memory_utilization" not in kw
    engine.release()  # no sleep mode on a CPU: nothing to release
    engine.generate([[5, 6]], [2], SPEC)
    engine.close()
    assert calls(vllm.EVENTS) == [
        "LLM",
        "generate",
        "shutdown",
        "destroy_model_parallel",
        "destroy_distributed_environment",  # the one-rank group vLLM made in this process
    ]


def test_cuda_engine_uses_cuda_graphs_and_starts_on_an_emptied_cache(
    vllm: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_cuda(monkeypatch, vllm)
    VLLMEngine("some/model", [2], sleep_mode=True, gpu_memory_utilization=0.4)
    assert calls(vllm.EVENTS) == ["empty_cache", "LLM"]
    kw = llm_kwargs(vllm)
    assert kw["enforce_eager"] is False and kw["enable_sleep_mode"] is True
    assert kw["gpu_memory_utilization"] == 0.4 and "kv_cache_memory_bytes" not in kw
    vllm.EVENTS.clear()
    VLLMEngine("some/model", [2], enforce_eager=True)  # an explicit choice wins
    assert llm_kwargs(vllm)["enforce_eager"] is True


def test_sleep_and_wake_order(vllm: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """A train step: generate, release, (score, update), sync; then the next step's generate."""
    on_cuda(monkeypatch, vllm)
    engine = VLLMEngine("some/model", [2], sleep_mode=True, dtype="bfloat16")
    model = Net()
    engine.sync_weights(model)  # awake: nothing to wake
    engine.generate([[5, 6]], [2], SPEC)
    start = len(vllm.EVENTS)
    engine.release()  # after generating: weights and KV cache dropped (level 2)
    engine.release()  # idempotent
    assert calls(vllm.EVENTS[start:]) == ["sleep(2)"]
    start = len(vllm.EVENTS)
    engine.sync_weights(model)  # wakes the weights only: the KV cache stays free for the trainer
    assert calls(vllm.EVENTS[start:]) == WAKE_AND_SYNC
    start = len(vllm.EVENTS)
    engine.generate([[5, 6]], [2], SPEC)  # the KV cache comes back for generation only
    assert calls(vllm.EVENTS[start:]) == WAKE_AND_GENERATE

    # released with no sync before the next generate (e.g. after validation): generate syncs
    # the dropped weights from the module the last sync read, then wakes the KV cache
    engine.release()
    start = len(vllm.EVENTS)
    engine.generate([[5, 6]], [2], SPEC)
    assert calls(vllm.EVENTS[start:]) == [*WAKE_AND_SYNC, *WAKE_AND_GENERATE]
    start = len(vllm.EVENTS)
    engine.release()
    engine.sync_weights(model)  # weights awake, KV cache asleep ...
    engine.release()  # ... a release still drops the weights
    assert calls(vllm.EVENTS[start:]) == ["sleep(2)", *WAKE_AND_SYNC, "sleep(2)"]
    engine.sync_weights(dict(model.state_dict()))  # from a dict: nothing to sync again from
    engine.release()
    with pytest.raises(RuntimeError, match="sync_weights"):
        engine.generate([[5, 6]], [2], SPEC)
    engine.sync_weights(model)
    engine.generate([[5, 6]], [2], SPEC)
    start = len(vllm.EVENTS)
    engine.sleep(level=1)  # weights kept in host memory: generate wakes both, weights first
    engine.generate([[5, 6]], [2], SPEC)
    assert calls(vllm.EVENTS[start:]) == ["sleep(1)", "empty_cache", "wake_up(weights)", *WAKE_AND_GENERATE]


def test_validation_after_the_sync_keeps_the_weights(
    vllm: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that validates: generate, release, sync, then validation's generate and its release
    (keep_weights: level 1, the synced weights wait in host memory); the next step's generate
    wakes them without loading a single tensor again (a level-2 release made it re-sync all)."""
    on_cuda(monkeypatch, vllm)
    engine = VLLMEngine("some/model", [2], sleep_mode=True)
    model = Net()
    engine.sync_weights(model)
    engine.generate([[5, 6]], [2], SPEC)
    engine.release()
    engine.sync_weights(model)
    start = len(vllm.EVENTS)
    engine.generate([[5, 6]], [2], SPEC)  # validation
    engine.release(keep_weights=True)
    engine.generate([[5, 6]], [2], SPEC)  # the next step's rollout
    kept = ["sleep(1)", "empty_cache", "wake_up(weights)"]  # the weights woken, nothing loaded again
    assert calls(vllm.EVENTS[start:]) == [*WAKE_AND_GENERATE, *kept, *WAKE_AND_GENERATE]


def test_sync_casts_each_tensor_to_the_engine_dtype_one_at_a_time(vllm: ModuleType) -> None:
    engine = VLLMEngine("some/model", [2], dtype="bfloat16")
    model = Net()
    engine.sync_weights(model)
    got = {e["name"]: e for e in vllm.received()}
    assert list(got) == list(model.state_dict())
    for name, t in model.state_dict().items():
        want = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert got[name]["dtype"] == str(want.dtype).removeprefix("torch.")
        assert got[name]["sum"] == float(want.double().sum())

    class Shard:
        """An FSDP2 DTensor shard stand-in that records its cast and its gather."""

        def __init__(self, name: str, dtype: torch.dtype = torch.float32) -> None:
            self.name, self.dtype = name, dtype

        def is_floating_point(self) -> bool:
            return True

        def to(self, dtype: torch.dtype) -> Shard:
            vllm.EVENTS.append({"call": "cast", "name": self.name})
            return Shard(self.name, dtype)

        def full_tensor(self) -> torch.Tensor:
            vllm.EVENTS.append({"call": "gather", "name": self.name, "dtype": str(self.dtype)})
            return torch.ones(2, dtype=self.dtype)

    start = len(vllm.EVENTS)
    engine.sync_weights({"a": Shard("a"), "b": Shard("b")})  # type: ignore[dict-item]
    trace = [(e["call"], e.get("name"), e.get("dtype")) for e in vllm.EVENTS[start:]]
    # cast (on the shard), gather (of bf16), load: parameter by parameter, never all at once
    assert trace == [
        ("cast", "a", None),
        ("gather", "a", "torch.bfloat16"),
        ("load", "a", "bfloat16"),
        ("cast", "b", None),
        ("gather", "b", "torch.bfloat16"),
        ("load", "b", "bfloat16"),
        ("reset_prefix_cache", None, None),
    ]


def test_auto_dtype_syncs_in_the_engine_dtype(vllm: ModuleType) -> None:
    engine = VLLMEngine("some/model", [2], dtype="auto")  # the stand-in resolves it to bf16
    engine.sync_weights(Net())
    assert {e["dtype"] for e in vllm.received()} == {"bfloat16", "int64"}


def test_sync_through_a_file_keeps_the_cast(vllm: ModuleType) -> None:
    engine = VLLMEngine("some/model", [2], dtype="float16", in_process=False)
    assert llm_kwargs(vllm)["env"][MP_ENV] == "1"
    engine.sync_weights(Net())
    assert {e["dtype"] for e in vllm.received()} == {"float16", "int64"}


def test_an_old_vllm_is_refused_before_it_starts(vllm: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def reload_weights(self: object) -> None:  # the pre-0.32 signature: from the checkpoint only
        pass

    monkeypatch.setattr(GPUModelRunner, "reload_weights", reload_weights)
    with pytest.raises(RuntimeError, match=r"too old.*weights_iterator.*vllm>=0\.32"):
        VLLMEngine("some/model", [2])
    assert not vllm.EVENTS


def test_tensor_parallelism_needs_torchrun(vllm: ModuleType) -> None:
    with pytest.raises(ValueError, match="torchrun"):
        VLLMEngine("some/model", [2], tensor_parallel_size=2)
    assert not vllm.EVENTS


def test_requests_are_seeded_unless_asked_not_to(vllm: ModuleType) -> None:
    engine = VLLMEngine("some/model", [2])
    engine.generate([[5, 6], [7], [8]], [2, 0, 1], SPEC)
    engine.generate([[5, 6], [7], [8]], [2, 0, 1], SamplingSpec(1.0, 1.0, 8, seed=3, seeded=False))
    seeded, unseeded = [e["seeds"] for e in vllm.EVENTS if e["call"] == "generate"]
    assert len(set(seeded)) == 2 and all(isinstance(s, int) for s in seeded)
    assert unseeded == [None, None]


# ---------------------------------------------------------------- the stand-in's own contract
SPEC6 = SamplingSpec(1.0, 1.0, 6, seed=3)


def asleep_engine(fake: ModuleType, monkeypatch: pytest.MonkeyPatch, level: int) -> VLLMEngine:
    on_cuda(monkeypatch, fake)
    engine = VLLMEngine("some/model", [2], sleep_mode=True)
    engine.sync_weights(Net())
    engine.llm.sleep(level=level)
    return engine


def test_generate_while_anything_sleeps_raises(vllm: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = asleep_engine(vllm, monkeypatch, level=1)
    with pytest.raises(vllm.StandInContractError, match="generate while"):
        engine.llm.generate([], [])
    engine.llm.wake_up(["weights"])
    with pytest.raises(vllm.StandInContractError, match=r"generate while \['kv_cache'\]"):
        engine.llm.generate([], [])
    engine.llm.wake_up(["kv_cache"])
    engine.llm.generate([], [])


def test_reload_while_the_weights_sleep_raises(vllm: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = asleep_engine(vllm, monkeypatch, level=2)
    weights = iter(Net().state_dict().items())
    with pytest.raises(vllm.StandInContractError, match="reload_weights while the weights sleep"):
        engine.llm.collective_rpc("exgrpo_reload_weights", args=(weights,))


def test_wake_order_and_tags(vllm: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = asleep_engine(vllm, monkeypatch, level=2)
    with pytest.raises(vllm.StandInContractError, match="kv_cache.*before the weights"):
        engine.llm.wake_up(["kv_cache"])
    engine.llm.wake_up(["weights"])
    with pytest.raises(vllm.StandInContractError, match="while only"):
        engine.llm.wake_up(["weights"])  # vLLM: a warning, and nothing woken
    assert engine.llm.wake_up(["kv_cache"]) is True


def test_sleep_needs_sleep_mode(vllm: ModuleType) -> None:
    engine = VLLMEngine("some/model", [2])
    with pytest.raises(vllm.StandInContractError, match="enable_sleep_mode"):
        engine.llm.sleep(level=2)


def test_logprobs_follow_the_weights_without_a_model(
    vllm: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_cuda(monkeypatch, vllm)
    engine = VLLMEngine("some/model", [2], sleep_mode=True)
    dummy = engine.generate([[5, 6]], [1], SPEC6)[0].logprobs
    engine.sync_weights(Net())
    synced = engine.generate([[5, 6]], [1], SPEC6)[0].logprobs
    assert synced != dummy
    engine.llm.sleep(level=1)  # kept in host memory: the same weights after the wake
    engine.llm.wake_up()
    assert engine.generate([[5, 6]], [1], SPEC6)[0].logprobs == synced
    engine.llm.sleep(level=2)  # discarded: woken without a reload they are not the weights
    engine.llm.wake_up()
    assert engine.generate([[5, 6]], [1], SPEC6)[0].logprobs != synced


@torch.no_grad()
def gap(model: torch.nn.Module, prompt: list[int], rollouts: list[Rollout]) -> float:
    diffs = []
    for r in rollouts:
        ids = torch.tensor([prompt + r.response_ids])
        logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1].float()
        mine = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.response_ids)[:, None])[:, 0]
        diffs.append((mine - torch.tensor(r.logprobs)).abs())
    return float(torch.cat(diffs).mean())


def test_a_real_model_samples_from_the_weights_it_was_given(
    vllm: ModuleType, monkeypatch: pytest.MonkeyPatch, tiny_model: Path
) -> None:
    from transformers import AutoModelForCausalLM

    on_cuda(monkeypatch, vllm)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    engine = VLLMEngine(str(tiny_model), [2], sleep_mode=True, load_format="dummy", dtype="float32")
    prompt = [5, 6, 7, 8]
    assert gap(model, prompt, engine.generate([prompt], [2], SPEC6)) > 0.5  # dummy weights
    engine.sync_weights(model)
    synced = gap(model, prompt, engine.generate([prompt], [2], SPEC6))
    assert synced < 1e-4, synced
    engine.llm.sleep(level=2)
    engine.llm.wake_up(["weights"])  # no reload: the discarded weights stay lost
    engine.llm.wake_up(["kv_cache"])
    assert gap(model, prompt, engine.generate([prompt], [2], SPEC6)) > 0.5
