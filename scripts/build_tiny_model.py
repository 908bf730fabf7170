"""Builds the project's own tiny causal LM (`builtin:tiny`), from nothing, on the CPU.

Three reproducible (seeded) stages, all offline:

1. a byte-level BPE tokenizer (a few hundred tokens) with Qwen2's own pre-tokenizer (what
   AutoTokenizer installs when it reloads the folder; it splits digits one per token, so arithmetic
   is learnable), trained on the arithmetic task's prompts and worked solutions, with a Qwen-style
   chat template, `<|endoftext|>` / `<|im_start|>` / `<|im_end|>` and the format markers as tokens;
2. a ~0.8M-parameter Qwen2 with random initial weights;
3. a short supervised warm start (response tokens only) on a pool of its own (the held-out set and
   the RL pool left out, so that RL questions are as new to it as held-out ones). Half of its
   answers skip the reasoning (`<think></think>\\boxed{85}`, right but unexplained), so the model
   starts with two habits: worked solutions (~48% correct, measured) and bare answers (~6%: it
   cannot add two-digit numbers in one step). Which habit pays off is what RL can learn on some
   questions and use on all, as reasoning-trained LLMs learn to think before answering; the
   response length in `metrics.jsonl` shows it happen.

It ends with the held-out sampled accuracy (temperature 1.0, K samples per question) and writes a
standard Hugging Face folder (safetensors, tokenizer, generation config) plus `build_info.json`.
The shipped model in `exgrpo_cli/assets/tiny/` is rebuilt with

    python scripts/build_tiny_model.py --out exgrpo_cli/assets/tiny      (what `make tiny-model` runs)

A build script, not part of the installed library: it imports exgrpo_cli (the task and the
template the model is warm-started on) but nothing imports it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from exgrpo_cli.data.synthetic import direct_answer, generate, train_and_val, worked_solution
from exgrpo_cli.data.templates import SHORT_SYSTEM, TEMPLATES
from exgrpo_cli.data.types import Question
from exgrpo_cli.reward.extract import last_boxed, strip_think

# The split Qwen2Tokenizer installs on load (transformers' qwen2 tokenizer); see build_tokenizer.
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# Single tokens for the answer-format markers: the model then emits each format step as one choice,
# and the reward's parsing of `</think>` / `\boxed{` never depends on how BPE happened to merge them.
FORMAT_TOKENS = ("<think>", "</think>", "\\boxed{")
VOCAB_SIZE = 512

# Qwen's ChatML layout, without Qwen's default system prompt (the templates bring their own).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# The task as configured by default (conf/data/synthetic.yaml): SFT sees only its training pool.
DATA = dict(num_train=4000, num_val=256, max_digits=2, ops=["+", "-", "*"], seed=1234)
SFT_POOL = 20000  # distinct warm-start questions (of the 3 x 100 x 100 possible ones)
SFT_STEPS = 1500
DIRECT_FRACTION = 0.5  # share of warm-start answers without reasoning (see encode_examples)
ASSET_DIR = Path(__file__).resolve().parent.parent / "exgrpo_cli" / "assets" / "tiny"


# ----------------------------------------------------------------------------------- tokenizer
def _tokenizer_corpus(questions: list[Question]) -> list[str]:
    """The strings the tokenizer sees, as often as training prompts hold them. Each chat piece goes in
    separately, so no merge spans a special token; the other templates' fixed text is in too, so that
    switching template does not spell every word letter by letter."""
    corpus = [t.system or t.render(q, None) for q in questions[:20] for t in TEMPLATES.values()]
    for q in questions:
        m = q.meta
        corpus += [
            "system\n",
            SHORT_SYSTEM,
            "\n",
            "user\n",
            q.question,
            "\n",
            "assistant\n",
            worked_solution(m["a"], m["op"], m["b"]),
        ]
    return corpus


def build_tokenizer(questions: list[Question]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    # AutoTokenizer loads any folder whose config says qwen2 as a Qwen2Tokenizer, which REPLACES the
    # normalizer and pre-tokenizer with Qwen2's own. So train with exactly those: the tokenizer that
    # every consumer (the trainer, vLLM, a user's script) loads then splits text the way the model
    # was trained. Qwen2's regex already gives each digit its own pre-token (carries stay learnable).
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = [PAD, IM_START, IM_END]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any text stays encodable
    )
    tok.train_from_iterator(_tokenizer_corpus(questions), trainer=trainer)
    # The format markers become whole tokens after training (ids at the end of the vocabulary):
    # added before it, their ids would collide with the special tokens the trainer puts first.
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in FORMAT_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=None,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )


# ------------------------------------------------------------------------------------- model
def build_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        # the rollout default: plain temperature-1 sampling from the full policy (HF would otherwise
        # truncate to the top 50 tokens, and HF only accepts top_k together with do_sample)
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
    )
    return model


# --------------------------------------------------------------------------------------- SFT
def encode_examples(
    questions: list[Question],
    tokenizer: PreTrainedTokenizerFast,
    *,
    direct_fraction: float = 0.0,
    seed: int = 0,
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) per question. Tokenized apart, as rollouts will see them.

    A seeded `direct_fraction` of the responses skip the reasoning (`direct_answer`): the answer is
    right, but a model this small cannot compute it without the steps, so copying that habit costs it
    accuracy. Reasoning first is then a behaviour RL can learn on some questions and use on all.
    """
    rng = random.Random(seed)
    out: list[tuple[list[int], list[int]]] = []
    for q in questions:
        prompt = TEMPLATES["think_short"].render(q, tokenizer)
        m = q.meta
        solve = direct_answer if rng.random() < direct_fraction else worked_solution
        response = solve(m["a"], m["op"], m["b"]) + IM_END
        out.append(
            (
                tokenizer.encode(prompt, add_special_tokens=False),
                tokenizer.encode(response, add_special_tokens=False),
            )
        )
    return out


def _batch(
    examples: list[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels (-100 on prompt and padding: loss on responses)."""
    width = max(len(p) + len(r) for p, r in examples)
    ids = torch.full((len(examples), width), pad_id)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (p, r) in enumerate(examples):
        n = len(p) + len(r)
        ids[i, :n] = torch.tensor(p + r)
        mask[i, :n] = 1
        labels[i, len(p) : n] = torch.tensor(r)
    return ids, mask, labels


def sft(
    model: Qwen2ForCausalLM,
    examples: list[tuple[list[int], list[int]]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    pad_id: int,
    log_every: int = 25,
) -> list[float]:
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, min(30, steps // 10))

    def lr_at(step: int) -> float:  # linear warmup, then cosine down to a tenth
        if step < warmup:
            return lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, steps - warmup)
        return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))

    order: list[int] = []
    losses = []
    model.train()
    for step in range(steps):
        if len(order) < batch_size:  # shuffled epochs
            fresh = list(range(len(examples)))
            rng.shuffle(fresh)
            order += fresh
        idx, order = order[:batch_size], order[batch_size:]
        ids, mask, labels = _batch([examples[i] for i in idx], pad_id)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % log_every == 0 or step == steps - 1:
            print(
                f"  sft step {step + 1:4d}/{steps}  loss {loss.item():.4f}  lr {lr_at(step):.2e}", flush=True
            )
    model.eval()
    return losses


# ------------------------------------------------------------------------------------ evaluation


def extract_answer(text: str) -> str | None:
    """Content of the last `\\boxed{}` after `</think>`: the reward's own parsing, without its
    unboxed fallbacks (the warm start is judged on the exact answer format RL will reward)."""
    after = strip_think(text, requires_think=True)
    return None if after is None else last_boxed(after)[1]


def is_correct(text: str, gold: str) -> bool:
    got = extract_answer(text)
    if got is None:
        return False
    try:
        return int(got) == int(gold)
    except ValueError:
        return got == gold


@torch.no_grad()
def sampled_accuracy(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    questions: list[Question],
    *,
    k: int,
    seed: int,
    max_new_tokens: int = 48,
    chunk: int = 32,
) -> dict:
    """Per-question correct counts out of k samples at temperature 1.0 (full distribution)."""
    torch.manual_seed(seed)
    counts, lengths, by_kind = [], [], {}
    by_habit = {"direct": [0, 0], "reasoning": [0, 0]}  # [responses, correct] per habit
    for start in range(0, len(questions), chunk):
        qs = questions[start : start + chunk]
        prompts = [TEMPLATES["think_short"].render(q, tokenizer) for q in qs]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_return_sequences=k,
            max_new_tokens=max_new_tokens,
        )
        new = out[:, enc["input_ids"].shape[1] :]
        texts = tokenizer.batch_decode(new, skip_special_tokens=True)
        lengths += (new != tokenizer.pad_token_id).sum(1).tolist()
        for i, q in enumerate(qs):
            c = 0
            for t in texts[i * k : (i + 1) * k]:
                ok = is_correct(t, q.answer)
                habit = by_habit["direct" if t.startswith("<think></think>") else "reasoning"]
                habit[0] += 1
                habit[1] += ok
                c += ok
            counts.append(c)
            # difficulty class: operator and operand lengths, e.g. "* 2x2" (the hard products)
            m = q.meta
            digits = sorted((len(str(m["a"])), len(str(m["b"]))), reverse=True)
            kind = f"{m['op']} {digits[0]}x{digits[1]}"
            by_kind.setdefault(kind, []).append(c)
    hist = Counter(counts)
    return {
        "accuracy": sum(counts) / (k * len(questions)),
        "k": k,
        "num_questions": len(questions),
        "histogram": [hist.get(c, 0) for c in range(k + 1)],  # questions with c correct out of k
        "accuracy_by_kind": {kd: round(sum(v) / (k * len(v)), 3) for kd, v in sorted(by_kind.items())},
        "mean_response_tokens": sum(lengths) / max(1, len(lengths)),
        "truncated_fraction": sum(n >= max_new_tokens for n in lengths) / max(1, len(lengths)),
        # responses with an empty reasoning block, and each habit's accuracy
        "direct_fraction": by_habit["direct"][0] / max(1, len(lengths)),
        "accuracy_by_habit": {h: round(ok / n, 3) if n else None for h, (n, ok) in by_habit.items()},
    }


def sft_pool(exclude: list[Question], seed: int, size: int = SFT_POOL) -> list[Question]:
    """The warm start's questions: a large pool drawn with a seed of its own, with `exclude` (the RL
    training pool and the held-out set) left out. A warm start that has seen the RL pool memorises
    those answers: it then scores far higher on them than on held-out questions (measured: ~0.46 vs
    0.33 sampled accuracy with 85% of the pool seen), and RL on memorised questions barely transfers."""
    excluded = {(q.meta["a"], q.meta["op"], q.meta["b"]) for q in exclude}
    pool = generate(
        size + len(exclude),
        max_digits=DATA["max_digits"],
        ops=DATA["ops"],
        seed=DATA["seed"] + 1 + seed,
        prefix="sft",
    )
    return [q for q in pool if (q.meta["a"], q.meta["op"], q.meta["b"]) not in excluded][:size]


# ------------------------------------------------------------------------------------------ main
def build(
    out: str | Path,
    *,
    sft_steps: int = SFT_STEPS,
    seed: int = 0,
    threads: int = 1,
    lr: float = 3e-3,
    batch_size: int = 64,
    direct_fraction: float = DIRECT_FRACTION,
    eval_questions: int = 256,
    eval_k: int = 8,
    argv: list[str] | None = None,
) -> dict:
    t0 = time.time()
    torch.set_num_threads(threads)
    random.seed(seed)
    train, val = train_and_val(
        DATA["num_train"], DATA["num_val"], max_digits=DATA["max_digits"], ops=DATA["ops"], seed=DATA["seed"]
    )
    tokenizer = build_tokenizer(train)
    model = build_model(tokenizer, seed)
    n_params = sum(p.numel() for p in model.parameters())
    # the RL pool and the held-out set hold every one-digit question (there are only 300), so the warm
    # start never sees one and scores 0-20% on them: hard questions for RL, measured and kept as they are
    examples = encode_examples(
        sft_pool(train + val, seed), tokenizer, direct_fraction=direct_fraction, seed=seed
    )
    longest = max(len(r) for _, r in examples)
    print(
        f"tokenizer: {len(tokenizer)} tokens; model: {n_params:,} parameters; "
        f"prompt tokens <= {max(len(p) for p, _ in examples)}, response tokens <= {longest}",
        flush=True,
    )

    losses = (
        sft(
            model,
            examples,
            steps=sft_steps,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
            pad_id=tokenizer.pad_token_id,
        )
        if sft_steps > 0
        else []
    )
    sft_s = time.time() - t0

    result = None
    if eval_questions > 0:
        result = sampled_accuracy(model, tokenizer, val[:eval_questions], k=eval_k, seed=seed + 1)
        print(
            f"held-out sampled accuracy (T=1.0, K={eval_k}, {result['num_questions']} questions): "
            f"{result['accuracy']:.3f}\n  by kind {result['accuracy_by_kind']}",
            flush=True,
        )
        print(f"questions with c/{eval_k} correct, c=0..{eval_k}: {result['histogram']}", flush=True)
        print(
            f"mean response tokens {result['mean_response_tokens']:.1f}, "
            f"truncated at 48: {result['truncated_fraction']:.3%}, "
            f"no reasoning: {result['direct_fraction']:.1%}; accuracy {result['accuracy_by_habit']}",
            flush=True,
        )

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    info = {
        "command": "python scripts/build_tiny_model.py " + shlex.join(argv or []),
        "seed": seed,
        "sft_steps": sft_steps,
        "lr": lr,
        "batch_size": batch_size,
        "threads": threads,
        "direct_fraction": direct_fraction,
        "data": DATA,
        "template": "think_short",
        "vocab_size": len(tokenizer),
        "num_parameters": n_params,
        "longest_response_tokens": longest,
        "final_sft_loss": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
        "heldout_sampled": result,
        "sft_seconds": round(sft_s, 1),
        "wall_seconds": round(time.time() - t0, 1),
        "torch": torch.__version__,
        # the CPU kernels torch picked: another instruction set rounds differently, and 1500 SFT
        # steps turn that into other weights (byte-for-byte rebuilds need the same one)
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"wrote {out} in {info['wall_seconds']:.0f}s", flush=True)
    return info


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="python scripts/build_tiny_model.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="output folder (the shipped one: exgrpo_cli/assets/tiny)")
    p.add_argument("--sft-steps", type=int, default=SFT_STEPS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (results depend on it)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--direct-fraction",
        type=float,
        default=DIRECT_FRACTION,
        help="share of warm-start answers given without reasoning (an empty <think></think>)",
    )
    p.add_argument("--eval-questions", type=int, default=256, help="held-out questions scored (0: skip)")
    p.add_argument("--eval-k", type=int, default=8, help="samples per held-out question")
    a = p.parse_args(argv)
    if not 0.0 <= a.direct_fraction <= 1.0:
        p.error(f"--direct-fraction must be in [0, 1], got {a.direct_fraction}")
    return build(
        a.out,
        sft_steps=a.sft_steps,
        seed=a.seed,
        threads=a.threads,
        lr=a.lr,
        batch_size=a.batch_size,
        direct_fraction=a.direct_fraction,
        eval_questions=a.eval_questions,
        eval_k=a.eval_k,
        argv=argv,
    )


if __name__ == "__main__":
    main()
