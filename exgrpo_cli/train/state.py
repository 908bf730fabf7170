"""Everything a checkpoint holds, in one object: the run state.

Where it sits: around the step. `RunState` owns the model, the optimizer, the fresh-question
sampler, the replay buffer, the delayed-start switch, the RNG states and the counters; the train
step reads and changes them through it. Saving, resuming and the per-step check that all ranks
agree all go through its `state_dict` / `load_state_dict` / `digest`, so a new stateful part is
added in one place: put it in `state_dict` (and `save`/`load` when it has files), and it is in
every checkpoint and, unless listed in `LOCAL_KEYS`, in the rank check as well.

Files of a checkpoint folder (written atomically by policy/checkpoint.py):
  model/                  HF folder (weights + tokenizer): AutoModelForCausalLM.from_pretrained works
  optimizer.safetensors   optimizer tensors; optimizer.json: param groups and layout
  replay/                 the experience buffer (arrays in safetensors + JSON index)
  rng.safetensors         torch's RNG state
  trainer_state.json      `state_dict()`: step, sampler, delayed start, counters, Python/NumPy RNGs
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from exgrpo_cli.data.sampler import QuestionSampler
from exgrpo_cli.policy import checkpoint as ckpt
from exgrpo_cli.policy import distributed as D
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.schedule import DelayedStart

# keys of `state_dict()` that may differ between ranks: everything else must agree on every rank
LOCAL_KEYS = ("wandb_id", "python_random", "numpy_random")


@dataclass
class RunState:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    sampler: QuestionSampler
    buffer: ExperienceBuffer
    switch: DelayedStart
    seed: int
    step: int = 0  # the last finished step
    skipped_in_a_row: int = 0  # updates skipped in a row (non-finite or huge gradient)
    wandb_id: str | None = None

    # ------------------------------------------------------------------ plain state
    def state_dict(self) -> dict[str, Any]:
        """The JSON part of the state (trainer_state.json); tensors and arrays go to files."""
        version, mt, gauss = random.getstate()
        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        return {
            "step": self.step,
            "seed": self.seed,
            "sampler": self.sampler.state_dict(),
            "delayed_start": self.switch.state_dict(),
            "skipped_in_a_row": self.skipped_in_a_row,
            "wandb_id": self.wandb_id,
            "python_random": [version, list(mt), gauss],
            "numpy_random": {
                "name": name,
                "keys": np.asarray(keys).tolist(),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached": float(cached),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        self.switch.load_state_dict(state["delayed_start"])
        self.skipped_in_a_row = int(state.get("skipped_in_a_row", 0))
        self.wandb_id = state.get("wandb_id")
        version, mt, gauss = state["python_random"]
        random.setstate((version, tuple(mt), gauss))
        n = state["numpy_random"]
        keys = np.array(n["keys"], dtype=np.uint32)
        np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached"]))

    def digest(self) -> str:
        """A digest of what every rank must hold alike: the shared part of `state_dict` and the
        buffer's membership, buckets, retired set, sizes and running checksum of the stored tokens
        and log-probs (kept up to date as experiences come and go: O(questions) here)."""
        shared = {k: v for k, v in self.state_dict().items() if k not in LOCAL_KEYS}
        b = self.buffer
        shared["buffer"] = [
            [b.questions_in_bucket(i) for i in range(b.num_buckets)],
            sorted(b.retired),
            b.num_questions,
            b.num_experiences,
            b.stored_tokens,
            b.checksum,  # every stored token and log-prob
        ]
        return hashlib.blake2b(json.dumps(shared, sort_keys=True).encode(), digest_size=8).hexdigest()

    # ------------------------------------------------------------------ checkpoint files
    def save(self, root: Path, keep: int, tokenizer: Any, dist: D.DistInfo) -> Path | None:
        """Write checkpoint `root/step_<step>` atomically (rank 0 writes; every rank calls this,
        since gathering sharded weights and optimizer state are collectives). Returns its path on
        rank 0, None elsewhere."""
        weights = D.full_state_dict(self.model, dist) if dist.distributed else None
        optim_state = D.full_optimizer_state_dict(self.model, self.optimizer, dist)
        if not dist.is_main:
            D.barrier(dist)
            return None

        def write(tmp: Path) -> None:
            self.model.save_pretrained(tmp / "model", safe_serialization=True, state_dict=weights)  # type: ignore[operator]
            tokenizer.save_pretrained(tmp / "model")
            ckpt.optimizer_state_to_files(optim_state, tmp)
            self.buffer.save(str(tmp / "replay"))
            save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
            ckpt.write_json(tmp / "trainer_state.json", self.state_dict())

        path = ckpt.save_checkpoint(root, self.step, write, keep)
        D.barrier(dist)  # nobody reads or deletes checkpoints while rank 0 writes one
        return path

    def load(self, folder: Path, dist: D.DistInfo) -> None:
        """Restore everything but the weights from checkpoint `folder` (the model was built from
        `folder/model`, see `resume_model_config`)."""
        if dist.distributed:  # the files hold the full state; each rank keeps its shard of it
            full = ckpt.optimizer_state_from_files(folder) if dist.is_main else {}
            D.load_full_optimizer_state_dict(self.model, self.optimizer, full, dist)
        else:
            ckpt.optimizer_from_files(self.optimizer, folder)
        self.buffer = ExperienceBuffer.load(str(folder / "replay"))
        self.load_state_dict(ckpt.read_json(folder / "trainer_state.json"))
        torch.set_rng_state(load_file(str(folder / "rng.safetensors"))["torch"])
