"""model.lora (policy/lora.py) on the tiny model, in one process: what is trained, what the
optimizer holds, the refusals, the adapter files (loaded by peft in a plain transformers process),
the merged export and the checks of a resumed adapter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exgrpo_cli.config.schema import ExgrpoConfig, LoraConfig, ModelConfig
from exgrpo_cli.errors import UsageError
from exgrpo_cli.parallel.offload import HostAdamW
from exgrpo_cli.policy import lora
from exgrpo_cli.policy.export import export_hf
from exgrpo_cli.policy.model import load_model

IDS = torch.tensor([[5, 17, 40, 3, 99, 12, 7, 64]])


def _lora_model(rank: int = 8, **kw: object) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(lora=LoraConfig(rank=rank, **kw))  # type: ignore[arg-type]
    return load_model(cfg, torch.device("cpu"))


def _perturb(model: torch.nn.Module) -> None:
    """Adapters as after training (B starts at zero: the adapted model would equal the base)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in lora.adapter_params(model).values():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))


def test_base_frozen_adapters_trainable_and_output_unchanged(tiny_model: Path) -> None:
    base = load_model(ModelConfig(), torch.device("cpu"))
    model = _lora_model()
    assert lora.is_lora(model) and not lora.is_lora(base)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(lora.is_adapter_name(n) for n in trainable)
    # 3 layers x 7 projections, A and B each
    assert len(trainable) == 3 * 7 * 2
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if n in trainable)
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, base(IDS).logits)  # B = 0 at the start


@pytest.mark.parametrize("host", [False, True])
def test_the_optimizer_holds_adapter_states_only(tiny_model: Path, host: bool) -> None:
    model = _lora_model()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = (HostAdamW if host else torch.optim.AdamW)(params, lr=1e-3)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    model(IDS, labels=IDS).loss.backward()
    opt.step()
    held = {id(p) for p in opt.state}
    assert held == {id(p) for p in params}
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    now = dict(model.named_parameters())
    assert all(torch.equal(now[n], v) for n, v in frozen.items()), "a frozen weight moved"


def test_every_forward_goes_through_the_adapter(tiny_model: Path) -> None:
    model = _lora_model()
    with torch.no_grad():
        before = model(IDS).logits
    _perturb(model)
    with torch.no_grad():
        assert not torch.allclose(model(IDS).logits, before)


def test_refusals_name_the_problem(tiny_model: Path) -> None:
    with pytest.raises(UsageError, match=r"model.lora.rank=65: larger than .*k_proj \(128 -> 64\)"):
        _lora_model(rank=65)
    with pytest.raises(UsageError, match=r"target_modules: \['qkv'\] match no linear layer"):
        _lora_model(target_modules=["q_proj", "qkv"])
    # the same, from the config alone (meta device), before any weights load
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(str(tiny_model))
    with pytest.raises(UsageError, match="rank=65"):
        lora.check_before_load(LoraConfig(rank=65), hf, "tiny")
    lora.check_before_load(LoraConfig(rank=64), hf, "tiny")  # the largest that fits


def test_range_checks() -> None:
    from exgrpo_cli.config.checks import validate
    from exgrpo_cli.config.schema import ConfigError

    for bad in ({"rank": -1}, {"alpha": 0.0}, {"dropout": 1.0}, {"target_modules": []}):
        cfg = ExgrpoConfig()
        cfg.model.lora = LoraConfig(**bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="model.lora"):
            validate(cfg)


def test_adapter_dropout_is_refused_in_training_only() -> None:
    """Training forwards run in train mode: dropout would be in pi_old and the stored log-probs but
    not in trajectory scoring, so `train` refuses it with one line; eval (eval mode) accepts it."""
    from exgrpo_cli.config.checks import validate
    from exgrpo_cli.config.schema import ConfigError

    cfg = ExgrpoConfig()
    cfg.model.lora = LoraConfig(rank=8, dropout=0.05)
    with pytest.raises(ConfigError, match=r"invalid model.lora.dropout=0.05: allowed 0 when training") as err:
        validate(cfg, "train")
    assert "\n" not in str(err.value)
    validate(cfg, "eval")
    cfg.model.lora = LoraConfig(rank=8, dropout=0.0)
    validate(cfg, "train")


def test_merged_export_is_the_adapted_model(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = _lora_model()
    _perturb(model)
    export_hf(model, tmp_path / "model", tokenizer=None)
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"))
    assert not any("lora" in n or "base_layer" in n for n, _ in plain.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(plain(IDS).logits, model(IDS).logits, atol=1e-4, rtol=1e-4)


PLAIN_LOAD = """
import sys, torch
from transformers import AutoModelForCausalLM
from peft import PeftModel
base = AutoModelForCausalLM.from_pretrained(sys.argv[1])
model = PeftModel.from_pretrained(base, sys.argv[2])
assert not any(m.startswith("exgrpo_cli") for m in sys.modules), "exgrpo_cli was imported"
with torch.no_grad():
    logits = model(torch.tensor([[5, 17, 40, 3, 99, 12, 7, 64]])).logits
torch.save(logits, sys.argv[3])
"""


def test_adapter_loads_with_peft_in_a_plain_transformers_process(tiny_model: Path, tmp_path: Path) -> None:
    model = _lora_model()
    _perturb(model)
    lora.save_adapter(model, tmp_path / "adapter")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [lora.CONFIG, lora.WEIGHTS]
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # no PYTHONPATH
    script = tmp_path / "load.py"
    script.write_text(PLAIN_LOAD)
    out = tmp_path / "logits.pt"
    res = subprocess.run(
        [sys.executable, str(script), str(tiny_model), str(tmp_path / "adapter"), str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    with torch.no_grad():
        torch.testing.assert_close(torch.load(out), model(IDS).logits)


def test_adapter_round_trip_and_its_recorded_base(tiny_model: Path, tmp_path: Path) -> None:
    model = _lora_model()
    _perturb(model)
    folder = tmp_path / "adapter"
    lora.save_adapter(model, folder)
    other = _lora_model()
    lora.load_adapter(other, folder)
    with torch.no_grad():
        assert torch.equal(other(IDS).logits, model(IDS).logits)
    assert lora.base_mismatch(folder, "builtin:tiny", other) is None
    assert "trained on 'builtin:tiny'" in str(lora.base_mismatch(folder, "other/model", other))
    # a base whose projections have other shapes
    wide = _lora_model(rank=4, target_modules=["q_proj"])
    record = json.loads((folder / lora.CONFIG).read_text())
    record["base_model_name_or_path"] = "x"
    (folder / lora.CONFIG).write_text(json.dumps(record))
    assert lora.base_mismatch(folder, "x", wide) is None  # its modules exist with these shapes
    with pytest.raises(ValueError, match="fits no adapter"):
        lora.load_adapter(wide, folder)


def test_resume_refuses_the_other_kind_other_settings_and_another_base(tmp_path: Path) -> None:
    ck = tmp_path / "step_2"
    (ck / "model").mkdir(parents=True)
    on = LoraConfig(rank=8)
    with pytest.raises(UsageError, match="holds a fully fine-tuned model"):
        lora.resume_adapter(on, "builtin:tiny", ck)
    assert lora.resume_adapter(LoraConfig(), "builtin:tiny", ck) is None
    model = _lora_model()
    lora.save_adapter(model, ck / lora.ADAPTER_DIR)
    assert lora.resume_adapter(on, "builtin:tiny", ck) == ck / lora.ADAPTER_DIR
    with pytest.raises(UsageError, match=r"model.lora.rank=0: resume it .*\(rank 8\)"):
        lora.resume_adapter(LoraConfig(), "builtin:tiny", ck)
    with pytest.raises(UsageError, match="trained with"):
        lora.resume_adapter(LoraConfig(rank=4), "builtin:tiny", ck)
    with pytest.raises(UsageError, match="trained on 'builtin:tiny'"):
        lora.resume_adapter(on, "Qwen/Qwen2.5-Math-1.5B", ck)


def test_the_frozen_base_is_stored_in_the_compute_dtype_under_mixed_precision() -> None:
    fp32 = ModelConfig(dtype="float32", lora=LoraConfig(rank=8))
    assert lora.frozen_base_dtype(fp32, "bf16", on_gpu=True).dtype == "bfloat16"
    assert lora.frozen_base_dtype(fp32, "fp16", on_gpu=True).dtype == "float16"
    assert lora.frozen_base_dtype(fp32, "bf16", on_gpu=False).dtype == "float32"  # a CPU ignores it
    assert lora.frozen_base_dtype(fp32, "", on_gpu=True).dtype == "float32"
    full = ModelConfig(dtype="float32")  # full fine-tuning keeps its float32 master weights
    assert lora.frozen_base_dtype(full, "bf16", on_gpu=True).dtype == "float32"
