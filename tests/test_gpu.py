"""GPU checks (marker `gpu`, skipped without CUDA): bf16 training with sdpa and flash-attn, the
`auto` attention choice, vLLM weight sync and sleep/wake on one GPU, and `exgrpo train` on a GPU.

The model is a random-weight Qwen2 (the layout of the paper's Qwen2.5 backbones at small sizes:
grouped-query attention, q/k/v biases, an untied head) saved with the shipped tiny model's
tokenizer, so nothing downloads. On a GPU node: `pytest -m gpu tests/test_gpu.py`; the flash-attn
and vLLM tests skip when those packages are missing (`pip install -e ".[gpu]"`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from conftest import TINY, metrics, run_cli

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from exgrpo_cli.policy.forward import SequenceBatch
    from exgrpo_cli.rollout.base import RolloutEngine

pytestmark = pytest.mark.gpu

DEVICE, DTYPE_NAME = "cuda", "bfloat16"
DTYPE = getattr(torch, DTYPE_NAME)
EOS, PAD = 2, 0
HAS_FLASH = importlib.util.find_spec("flash_attn") is not None
HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(TINY)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("qwen2-random")
    Qwen2ForCausalLM(cfg).to(DTYPE).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _load(folder: Path, attn: str) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPE, attn_implementation=attn).to(DEVICE)


def _rows(n: int = 8) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts and responses of different lengths: right padding, i.e. flash-attn's varlen path."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 300, (12 + i,), generator=g).tolist() for i in range(n)]
    responses = [torch.randint(10, 300, (24 + 3 * i,), generator=g).tolist() for i in range(n)]
    return prompts, responses


def _gap(model: PreTrainedModel, sb: SequenceBatch, adv: torch.Tensor) -> float:
    """Mean response log-prob of the positive-advantage rows minus that of the negative ones."""
    from exgrpo_cli.policy.forward import forward_logprobs

    with torch.no_grad():
        logp, _ = forward_logprobs(model, sb)
    per_row = (logp.float() * sb.response_mask).sum(-1) / sb.response_mask.sum(-1)
    return float(per_row[adv > 0].mean() - per_row[adv < 0].mean())


def _train_steps(model: PreTrainedModel, steps: int = 5, lr: float = 1e-3) -> tuple[float, float]:
    """A few policy-gradient steps with fixed advantages; returns the positive-minus-negative
    log-prob gap before and after (it must grow: the update goes the way the advantages say)."""
    from exgrpo_cli.algo import exgrpo_token_losses
    from exgrpo_cli.policy.forward import forward_logprobs, pack

    prompts, responses = _rows()
    sb = pack(prompts, responses, list(range(8)), PAD, torch.device(DEVICE))
    adv = torch.tensor([1.0, -1.0] * 4, device=DEVICE)
    before = _gap(model, sb, adv)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        logp, _ = forward_logprobs(model, sb)
        assert logp.dtype in (DTYPE, torch.float32)
        losses, _ = exgrpo_token_losses(
            logp,
            logp.detach(),
            adv,
            sb.response_mask,
            torch.zeros(8, dtype=torch.bool, device=DEVICE),
            clip_eps=0.2,
            beta=0.1,
        )
        loss = losses.sum() / (8 * 48.0)
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
    assert all(p.dtype == DTYPE for p in model.parameters())  # trained in bf16 end to end
    return before, _gap(model, sb, adv)


@pytest.mark.parametrize(
    "attn",
    [
        "sdpa",
        pytest.param(
            "flash_attention_2", marks=pytest.mark.skipif(not HAS_FLASH, reason="flash-attn is not installed")
        ),
    ],
)
def test_bf16_train_steps_follow_the_advantages(qwen2_dir: Path, attn: str) -> None:
    before, after = _train_steps(_load(qwen2_dir, attn))
    assert after > before + 0.05, (before, after)


@pytest.mark.skipif(not HAS_FLASH, reason="flash-attn is not installed")
def test_flash_attention_matches_sdpa_on_padded_rows(qwen2_dir: Path) -> None:
    from exgrpo_cli.policy.forward import forward_logprobs, pack

    prompts, responses = _rows()
    sb = pack(prompts, responses, list(range(8)), PAD, torch.device(DEVICE))
    with torch.no_grad():
        a, _ = forward_logprobs(_load(qwen2_dir, "flash_attention_2"), sb)
        b, _ = forward_logprobs(_load(qwen2_dir, "sdpa"), sb)
    diff = (a.float() - b.float()).abs() * sb.response_mask
    assert diff.max() < 0.1 and diff.sum() / sb.response_mask.sum() < 0.02  # bf16 rounding only


@pytest.mark.skipif(not HAS_FLASH, reason="flash-attn is not installed")
def test_auto_attention_picks_flash_attn_on_a_gpu(qwen2_dir: Path) -> None:
    from exgrpo_cli.config.schema import ModelConfig
    from exgrpo_cli.policy.model import load_model

    cfg = ModelConfig(path=str(qwen2_dir), dtype="bfloat16", attn_implementation="auto")
    model = load_model(cfg, torch.device(DEVICE))
    assert model.config._attn_implementation == "flash_attention_2"
    assert next(model.parameters()).dtype == DTYPE


def _engine_diff(engine: RolloutEngine, model: PreTrainedModel, prompts: list[list[int]]) -> float:
    """Mean |vLLM - trainer| log-prob over the tokens vLLM samples for `prompts` (4 each)."""
    from exgrpo_cli.policy.forward import forward_logprobs, pack
    from exgrpo_cli.rollout.base import SamplingSpec

    out = engine.generate(prompts, [4] * len(prompts), SamplingSpec(1.0, 1.0, 32, seed=0))
    sb = pack(
        [prompts[o.prompt_index] for o in out],
        [o.response_ids for o in out],
        list(range(len(out))),
        PAD,
        torch.device(DEVICE),
    )
    with torch.no_grad():
        lp, _ = forward_logprobs(model, sb)
    diffs = []
    for r, o in enumerate(out):
        trainer = lp[r, : len(o.response_ids)].float().cpu()  # log-probs are response-aligned
        diffs.append((trainer - torch.tensor(o.logprobs)).abs())
    return float(torch.cat(diffs).mean())


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
def test_vllm_sync_and_sleep_on_one_gpu(qwen2_dir: Path) -> None:
    from exgrpo_cli.rollout.vllm_engine import VLLMEngine

    model = _load(qwen2_dir, "sdpa")
    # dummy weights at start: the first sync must bring the trainer's in
    engine = VLLMEngine(
        str(qwen2_dir),
        [EOS],
        dtype=DTYPE_NAME,
        max_model_len=256,
        load_format="dummy",
        gpu_memory_utilization=0.3,
        sleep_mode=True,
    )
    prompts, _ = _rows(3)
    try:
        engine.sync_weights(model)
        synced = _engine_diff(engine, model, prompts)
        _train_steps(model)  # the trainer moves on; the engine still holds the old weights
        stale = _engine_diff(engine, model, prompts)
        # sharing the GPU with the update: sleeping drops the KV cache and offloads the weights
        free_awake = torch.cuda.mem_get_info()[0]
        engine.sleep()
        freed = torch.cuda.mem_get_info()[0] - free_awake
        engine.sync_weights(model)  # wakes the weights only, then loads the new ones
        fresh = _engine_diff(engine, model, prompts)  # generate wakes the KV cache too
        print(
            f"\nvLLM vs trainer ({DTYPE_NAME}): synced {synced:.4f}, stale {stale:.4f}, after sleep+sync "
            f"{fresh:.4f}; sleep freed {freed / 2**30:.1f} GiB"
        )
        assert synced < 0.05 and fresh < 0.05, (synced, fresh)
        assert stale > 3 * max(fresh, 0.01), (stale, fresh)
        assert freed > 2**30, f"sleep freed only {freed / 2**20:.0f} MiB"
    finally:
        engine.close()


@pytest.mark.parametrize(
    "engine",
    ["hf", pytest.param("vllm", marks=pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed"))],
)
def test_train_cli_bf16_on_gpu(qwen2_dir: Path, tmp_path: Path, engine: str) -> None:
    """The real command on the GPU: bf16, attention `auto` (flash-attn when installed), and with
    rollout=vllm a weight sync after every step (the log-prob gap stays at bf16 rounding)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    res = run_cli(
        [
            "train",
            f"rollout={engine}",
            "model=tiny",  # the tiny settings (template, engine) for a small Qwen2 of the test's own
            f"model.path={qwen2_dir}",
            f"model.dtype={DTYPE_NAME}",
            f"trainer.device={DEVICE}",
            "trainer.steps=3",
            "algo.questions_per_step=8",
            "rollout.n=4",
            "algo.lr=1e-4",
            "trainer.val_questions=8",
            "trainer.val_samples=1",
            "logger.wandb.mode=disabled",
            "logger.console=false",
            "rollout.gpu_memory_utilization=0.3",
            f"hydra.run.dir={out}",
        ],
        timeout=1200,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    rows = {r["step"]: r for r in metrics(out)}
    assert sorted(rows) == [0, 1, 2, 3]
    for step in (1, 2, 3):
        assert rows[step]["rollout/logprob_diff_mean"] < 0.05, (step, rows[step])
        assert rows[step]["optim/skipped_steps"] == 0.0
    model = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step_3" / "model")
    assert model.config.model_type == "qwen2" and not model.config.tie_word_embeddings
