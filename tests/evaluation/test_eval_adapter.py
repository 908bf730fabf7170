"""`exgrpo eval model.path=<base> eval.adapter=<checkpoint>` (evaluation/adapter.py): base +
adapter scores as the merged model does; an adapter of another base, a folder without one and a
checkpoint whose adapter changed after it was written are refused with exit 2 before any load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.config.schema import LoraConfig, ModelConfig
from exgrpo_cli.policy import lora
from exgrpo_cli.policy.export import export_hf
from exgrpo_cli.policy.model import load_model

from conftest import run_cli

pytestmark = pytest.mark.slow

EVAL = ["model=tiny", "eval.limit=12", "eval.n=1", "trainer.threads=1"]


@pytest.fixture(scope="module")
def adapted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A published checkpoint holding an adapter (trained-like: B not zero) of builtin:tiny, and
    the same model merged into a plain HF folder."""
    root = tmp_path_factory.mktemp("adapted")
    torch.manual_seed(0)
    model = load_model(ModelConfig(lora=LoraConfig(rank=8)), torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in lora.adapter_params(model).values():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    saved = ckpt.save_checkpoint(
        root / "checkpoints", 5, lambda tmp: lora.save_adapter(model, tmp / lora.ADAPTER_DIR), keep=2
    )
    assert saved is not None
    export_hf(model, root / "merged", tokenizer=None)
    import shutil

    from exgrpo_cli.policy.model import resolve_path

    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(Path(resolve_path("builtin:tiny")) / name, root / "merged" / name)
    return saved, root / "merged"


def _eval(out: Path, *args: str) -> dict:
    res = run_cli(["eval", *EVAL, *args, f"eval.output_dir={out}", f"hydra.run.dir={out}"])
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def _responses(out: Path) -> list[str]:
    rows = map(json.loads, (out / "generations.jsonl").read_text().splitlines())
    return [r["response"] for r in rows]


@pytest.mark.long  # ~28 s: make test-long
def test_base_plus_adapter_scores_as_the_merged_model(adapted: tuple[Path, Path], tmp_path: Path) -> None:
    checkpoint, merged = adapted
    with_adapter = _eval(tmp_path / "a", "model.path=builtin:tiny", f"eval.adapter={checkpoint}")
    plain = _eval(tmp_path / "m", f"model.path={merged}")
    base = _eval(tmp_path / "b", "model.path=builtin:tiny")
    assert _responses(tmp_path / "a") == _responses(tmp_path / "m")
    assert _responses(tmp_path / "a") != _responses(tmp_path / "b"), "the adapter changed nothing"
    scores = [r["models"][0]["benchmarks"]["synthetic"]["score"] for r in (with_adapter, plain, base)]
    assert scores[0] == scores[1], scores
    assert with_adapter["models"][0]["label"].endswith(f"+ {checkpoint / 'adapter'}")


def test_refusals_exit_2_before_any_load(adapted: tuple[Path, Path], tmp_path: Path) -> None:
    checkpoint, merged = adapted
    cases = [
        ([f"model.path={merged}", f"eval.adapter={checkpoint}"], "trained on 'builtin:tiny'"),
        (["model.path=builtin:tiny", f"eval.adapter={merged}"], "holds no LoRA adapter"),
    ]
    for args, message in cases:
        res = run_cli(["eval", *EVAL, *args, f"hydra.run.dir={tmp_path / 'x'}"])
        assert res.returncode == 2 and message in res.stderr, res.stderr[-2000:]
    weights = checkpoint / lora.ADAPTER_DIR / lora.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    try:
        res = run_cli(["eval", *EVAL, "model.path=builtin:tiny", f"eval.adapter={checkpoint}"])
        assert res.returncode == 2 and "does not verify" in res.stderr, res.stderr[-2000:]
    finally:
        data[-1] ^= 1
        weights.write_bytes(bytes(data))
