"""The tiny-model builder: a small build loads as a standard HF folder and is reproducible; the
shipped `exgrpo_cli/assets/tiny` loads offline with the expected special tokens."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub, even by accident

from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from exgrpo_cli.data.synthetic import direct_answer, make_question, worked_solution  # noqa: E402
from exgrpo_cli.data.templates import TEMPLATES  # noqa: E402

from conftest import REPO  # noqa: E402
from shared_artefacts import build_once, session_root  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
import build_tiny_model as tiny_builder  # noqa: E402

Builds = tuple[list[Path], list[dict]]  # two build folders (same seed) and what main() returned
SMALL = ["--sft-steps", "3", "--seed", "7", "--threads", "1", "--eval-questions", "4", "--eval-k", "2"]


@pytest.fixture(scope="module")
def two_builds(request: pytest.FixtureRequest) -> Builds:
    """Two small builds with the same seed, made once per test run (also when pytest-xdist gives
    this file's tests to several workers); the tests only read them."""

    def build(folder: Path) -> None:
        threads = torch.get_num_threads()
        try:
            infos = [tiny_builder.main(["--out", str(folder / f"tiny{i}"), *SMALL]) for i in range(2)]
        finally:
            torch.set_num_threads(threads)
        (folder / "infos.json").write_text(json.dumps(infos))

    folder = build_once(session_root(request), "tiny-builds", build)
    return [folder / "tiny0", folder / "tiny1"], json.loads((folder / "infos.json").read_text())


def _load(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _check_special_tokens(tok: PreTrainedTokenizerBase, model: PreTrainedModel) -> None:
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert "<|im_start|>" in tok.get_vocab()
    assert tok.padding_side == "left"
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert model.config.vocab_size == len(tok)


@pytest.mark.slow
def test_built_folder_loads_and_renders(two_builds: Builds):
    (out, _), (info, _) = two_builds
    model, tok = _load(out)
    _check_special_tokens(tok, model)
    q = make_question("t", 37, "*", 45)
    prompt = TEMPLATES["think_short"].render(q, tok)
    assert prompt.startswith("<|im_start|>system\n")
    assert "<|im_start|>user\nWhat is 37*45?<|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tok.encode(prompt, add_special_tokens=False)
    assert tok.decode(ids) == prompt
    assert len(ids) <= 40  # prompts stay cheap (model.max_prompt_tokens is 128)
    # every digit is its own token, so numbers are spelled digit by digit
    assert tok.tokenize("1234567890") == list("1234567890")
    # the format markers are single tokens, and a full worked solution fits the 48-token budget
    for marker in ("<think>", "</think>", "\\boxed{"):
        assert len(tok.encode(marker, add_special_tokens=False)) == 1
    longest = worked_solution(98, "*", 97) + "<|im_end|>"
    assert len(tok.encode(longest, add_special_tokens=False)) <= 44
    meta = json.loads((out / "build_info.json").read_text())
    assert meta["sft_steps"] == 3 and meta["seed"] == 7 and meta["num_parameters"] == info["num_parameters"]
    assert 0.0 <= meta["heldout_sampled"]["accuracy"] <= 1.0


@pytest.mark.slow
def test_reloaded_tokenizer_splits_like_the_trained_one(two_builds: Builds, tmp_path: Path):
    """AutoTokenizer loads a qwen2 folder as Qwen2Tokenizer, which installs its own pre-tokenizer: the
    builder must train with that one, or the reloaded model sees text split unlike its training data."""
    (out, _), _ = two_builds
    _, reloaded = _load(out)
    pool = [
        make_question(str(i), a, op, b)
        for i, (a, op, b) in enumerate(
            [(3, "+", 4), (98, "*", 97), (10, "-", 57), (0, "*", 5), (41, "+", 59)]
        )
    ]
    built = tiny_builder.build_tokenizer(pool)
    assert type(reloaded).__name__ == "Qwen2Tokenizer"
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "\\boxed{"):
        assert len(built.encode(special, add_special_tokens=False)) == 1, special
    text = TEMPLATES["think_short"].render(pool[1], reloaded) + worked_solution(98, "*", 97) + "<|im_end|>"
    saved = tmp_path / "probe"
    built.save_pretrained(saved)
    (saved / "config.json").write_text((out / "config.json").read_text())  # a qwen2 folder
    assert AutoTokenizer.from_pretrained(saved).encode(text) == built.encode(text, add_special_tokens=False)


@pytest.mark.slow
def test_generate_from_loaded_folder(two_builds: Builds):
    (out, _), _ = two_builds
    model, tok = _load(out)
    qs = [make_question("a", 3, "+", 4), make_question("b", 12, "*", 34)]
    enc = tok(
        [TEMPLATES["think_short"].render(q, tok) for q in qs],
        return_tensors="pt",
        padding=True,
        add_special_tokens=False,
    )
    torch.manual_seed(0)
    gen = model.generate(**enc, max_new_tokens=8)  # the saved generation config samples
    assert gen.shape[0] == 2 and gen.shape[1] <= enc["input_ids"].shape[1] + 8
    greedy = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert greedy.shape[0] == 2


@pytest.mark.slow
def test_same_seed_same_build(two_builds: Builds):
    (a, b), _ = two_builds
    for name in ("tokenizer.json", "config.json", "generation_config.json"):
        assert (a / name).read_text() == (b / name).read_text(), name
    ma, mb = AutoModelForCausalLM.from_pretrained(a), AutoModelForCausalLM.from_pretrained(b)
    sa, sb = ma.state_dict(), mb.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_other_seed_other_init():
    tok = tiny_builder.build_tokenizer([make_question("x", 1, "+", 2)] * 3)
    w0 = tiny_builder.build_model(tok, 0).model.embed_tokens.weight
    w1 = tiny_builder.build_model(tok, 1).model.embed_tokens.weight
    assert not torch.equal(w0, w1)
    assert torch.equal(w0, tiny_builder.build_model(tok, 0).model.embed_tokens.weight)


def test_answer_extraction():
    ok = "<think>3+4 = 7</think>\\boxed{7}"
    assert tiny_builder.is_correct(ok, "7")
    assert not tiny_builder.is_correct("<think>3+4 = 7\\boxed{7}", "7")  # no </think>
    assert not tiny_builder.is_correct("\\boxed{7}</think>nothing", "7")  # box must follow </think>
    assert tiny_builder.extract_answer("<think>x</think>\\boxed{1} then \\boxed{-12}") == "-12"


def test_shipped_asset_loads():
    path = tiny_builder.ASSET_DIR
    if not (path / "config.json").exists():
        pytest.skip("exgrpo_cli/assets/tiny is not built yet")
    model, tok = _load(path)
    _check_special_tokens(tok, model)
    assert model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    assert tok.chat_template and tok.tokenize("907") == ["9", "0", "7"]
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    assert size < 8 * 2**20, f"the shipped tiny model is {size / 2**20:.1f} MiB"
    info = json.loads((path / "build_info.json").read_text())
    assert info["heldout_sampled"]["accuracy"] > 0.1
    # the two habits docs/training-and-configs.md describes: bare answers in a large share of
    # responses, far less accurate than reasoned ones
    held = info["heldout_sampled"]
    assert 0.2 < held["direct_fraction"] < 0.8
    assert held["accuracy_by_habit"]["direct"] < held["accuracy_by_habit"]["reasoning"] - 0.2


def test_warm_start_pool_leaves_out_the_rl_pool_and_the_held_out_set():
    train, val = tiny_builder.train_and_val(**tiny_builder.DATA)
    key = lambda q: (q.meta["a"], q.meta["op"], q.meta["b"])  # noqa: E731
    pool = tiny_builder.sft_pool(train + val, seed=0)
    seen = {key(q) for q in pool}
    assert len(pool) == tiny_builder.SFT_POOL == len(seen)
    assert not seen & {key(q) for q in val}
    assert not seen & {key(q) for q in train}


def test_direct_fraction_of_warm_start_answers_skips_the_reasoning():
    tok = tiny_builder.build_tokenizer(tiny_builder.train_and_val(**tiny_builder.DATA)[0][:200])
    pool = tiny_builder.sft_pool([], seed=0, size=400)
    direct = tok.encode("<think></think>", add_special_tokens=False)

    def share(examples: list[tuple[list[int], list[int]]]) -> float:
        return sum(r[: len(direct)] == direct for _, r in examples) / len(examples)

    assert share(tiny_builder.encode_examples(pool, tok)) == 0.0
    mixed = tiny_builder.encode_examples(pool, tok, direct_fraction=0.4, seed=3)
    assert 0.3 < share(mixed) < 0.5
    assert mixed == tiny_builder.encode_examples(pool, tok, direct_fraction=0.4, seed=3)
    for q, (_, response) in zip(pool[:20], mixed[:20]):  # skipped or not, the answer is right
        m = q.meta
        solve = direct_answer if response[: len(direct)] == direct else worked_solution
        assert tok.decode(response) == solve(m["a"], m["op"], m["b"]) + "<|im_end|>"
