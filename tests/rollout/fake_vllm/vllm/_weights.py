"""The stand-in engine's copy of the weights, and the log-probs it samples with them.

What vLLM 0.32 does with its weights, kept here (read in its released source):
- a sleep at level 2 discards them (CuMemAllocator unmaps the memory; gpu_worker.py saves only the
  buffers): woken without a reload they hold whatever the fresh allocation holds, here noise;
- level 1 moves them to host memory and back, unchanged;
- `reload_weights(weights_iterator=...)` writes each tensor into the existing storage.

With a real HF folder as `model=` the stand-in builds that model (random weights, as vLLM's
load_format="dummy"; the checkpoint's with "auto"), loads what the sync sends into it, and samples
from it: its log-probs are the model's, so a sync that did not arrive, or arrived wrong, shows in
the trainer's log-prob gap. Without a folder (a made-up path) it keeps a fingerprint of the tensors
it was last given, and the log-probs it reports are a function of that fingerprint.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

# the linear layers vLLM's LoRA manager wraps in a Qwen2/Llama (all of its LoRA-supported modules,
# whatever the adapter targets: their fused qkv_proj and gate_up_proj are these three and two)
LORA_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LinearWithLoRA(torch.nn.Module):
    """vLLM's BaseLinearLayerWithLoRA as far as names go: the original layer is `base_layer`."""

    def __init__(self, base_layer: torch.nn.Module) -> None:
        super().__init__()
        self.base_layer = base_layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x)


def wrap_lora_layers(model: torch.nn.Module) -> None:
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if name in LORA_LAYERS and isinstance(child, torch.nn.Linear):
                setattr(parent, name, LinearWithLoRA(child))


class StandInWeights:
    def __init__(self, model_path: str, load_format: str, lora: bool = False) -> None:
        self.model: Any = None
        self.fingerprint = 0.123  # dummy weights: an arbitrary value, not the trainer's
        if os.path.isfile(os.path.join(model_path, "config.json")):
            from transformers import AutoConfig, AutoModelForCausalLM

            if load_format == "dummy":
                with torch.random.fork_rng():  # the trainer's RNG is not the stand-in's to move
                    torch.manual_seed(12345)
                    cfg = AutoConfig.from_pretrained(model_path)
                    self.model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
            else:
                self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
            self.model.eval()
            if lora:
                wrap_lora_layers(self.model)
            # a reload takes Hugging Face names: those of the LoRA-wrapped layers' `base_layer`s too
            self.names = {n.replace(".base_layer.", "."): n for n in self.model.state_dict()}

    def load(self, name: str, tensor: torch.Tensor) -> None:
        if self.model is not None:
            if name not in self.names:
                raise KeyError(f"stand-in vLLM: no parameter {name!r} in the model")
            with torch.no_grad():
                self.model.state_dict()[self.names[name]].copy_(tensor.to(torch.float32))
        else:
            self.fingerprint = math.fmod(self.fingerprint * 31 + float(tensor.double().sum()), 1000.0)

    def discard(self) -> None:
        """A level-2 sleep: the memory is gone; what a wake maps back is not the weights."""
        if self.model is not None:
            with torch.no_grad(), torch.random.fork_rng():
                for p in self.model.parameters():
                    p.normal_(0.0, 1.0)
        else:
            self.fingerprint = 777.0

    def flat_logprob(self) -> float:
        """The log-prob reported for every token without a real model: follows the weights."""
        return -0.05 - abs(self.fingerprint) % 5.0

    @torch.no_grad()
    def sample(self, prompt: list[int], sp: Any, mode: str) -> list[tuple[list[int], list[float], str]]:
        """sp.n samples of `prompt`: (tokens, log-probs, finish reason) each. Log-probs of the
        sampled tokens: raw (log_softmax of the logits) or processed (after the temperature)."""
        kw = sp.kwargs
        temperature, top_p = float(kw.get("temperature", 1.0)), float(kw.get("top_p", 1.0))
        if mode == "processed_logprobs" and top_p < 1.0:
            raise NotImplementedError("stand-in vLLM: processed log-probs with top_p < 1")
        stops = [int(t) for t in kw.get("stop_token_ids") or []]
        with torch.random.fork_rng():
            torch.manual_seed(int(sp.seed) if sp.seed is not None else 0)
            out = self.model.generate(
                input_ids=torch.tensor([prompt] * sp.n),
                attention_mask=torch.ones(sp.n, len(prompt), dtype=torch.long),
                do_sample=True,
                temperature=temperature,
                top_p=top_p,
                top_k=0,
                max_new_tokens=sp.max_tokens,
                eos_token_id=stops or None,
                pad_token_id=stops[0] if stops else 0,
                output_logits=True,
                return_dict_in_generate=True,
            )
        logits = torch.stack(out.logits, 1).float()  # [n, steps, vocab], raw
        if mode == "processed_logprobs":
            logits = logits / temperature
        logp = torch.log_softmax(logits, -1)
        samples = []
        for k in range(sp.n):
            toks, reason = [], "length"
            for tok in out.sequences[k, len(prompt) :].tolist():
                toks.append(int(tok))
                if tok in stops:
                    reason = "stop"
                    break
            lps = [float(logp[k, j, t]) for j, t in enumerate(toks)]
            samples.append((toks, lps, reason))
        return samples
