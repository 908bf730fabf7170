"""Everything a checkpoint holds, in one object: the run state.

Where it sits: around the step. `RunState` owns the model, the optimizer, the fresh-question
sampler, the replay buffer, the delayed-start switch, the RNG states and the counters; the train
step reads and changes them through it. Saving, resuming and the per-step check that all ranks
agree all go through its `state_dict` / `load_state_dict` / `digest`, so a new stateful part is
added in one place: put it in `state_dict` (and `save`/`load` when it has files), and it is in
every checkpoint and, unless listed in `LOCAL_KEYS`, in the rank check as well.

Files of a checkpoint folder (written atomically by checkpoint/store.py):
  model/                  HF folder (weights + tokenizer): AutoModelForCausalLM.from_pretrained works;
                          with model.lora, only in the run's last checkpoint, the adapter merged in
  adapter/                model.lora: the adapter in peft's format (+ tokenizer); the base is model.path
  optimizer/              the optimizer state, a shard per rank (reshardable) + param_groups.json
  replay/                 the experience buffer (arrays in safetensors + JSON index)
  rng.safetensors         torch's RNG state
  trainer_state.json      `state_dict()`: step, sampler, delayed start, counters, best validation,
                          Python/NumPy RNGs

RNG states. A resumed run repeats its steps exactly without them: every draw of a step comes from
generators derived from (trainer.seed, step) (`step_rng` below, the rollout seed) or from
state saved here (the sampler's). The engines reseed from the rollout seed on every call: the HF
engine's own loop samples with generators seeded from it, its `generate` path reseeds torch's
global RNG per chunk from it, vLLM gets per-request seeds from it. Nothing in a step draws from
the global Python, NumPy or torch RNGs (tests/train/test_rng.py), so saving rank 0's states only,
and restoring them on every rank, loses nothing; they are kept for code that would draw from
them, e.g. a model with dropout on a CPU (torch's CUDA generators are not saved).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from exgrpo_cli.checkpoint import optimizer_files
from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.checkpoint.optimizer_groups import own_hyper, restore_hyper
from exgrpo_cli.data.sampler import QuestionSampler
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy import lora
from exgrpo_cli.policy.export import export_hf
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.persistence import load_buffer
from exgrpo_cli.replay.schedule import DelayedStart

# keys of `state_dict()` that may differ between ranks: everything else must agree on every rank
# (the global RNG states: rank 0's are saved, and nothing in a step reads them; see above)
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
    skipped_in_a_row: int = 0  # optimizer updates skipped in a row, across steps (`count_updates`)
    wandb_id: str | None = None
    # trainer.keep_best: {"step", "score"} of the best validation so far, saved with the state so
    # that a resumed or rolled-back run compares with the best of the history it continues
    best: dict[str, Any] | None = None
    # what the run trains on, checked at resume (run/resume.py `check_resume_data`): a digest of
    # the training questions' ids in pool order (the sampler's indices point into that order)
    data_fingerprint: str = ""
    # replay.readmit_into=batch: re-admitted questions not yet trained, served first into the next
    # steps' fresh slots (uids, in re-admission order)
    readmit_queue: list[str] = field(default_factory=list)
    # the config sections that decide what is trained, as plain data (run/resume_changes.py):
    # written with each checkpoint as config.json, compared with the command's at resume
    trained_with: dict[str, Any] = field(default_factory=dict)

    def count_updates(self, applied: list[bool]) -> None:
        """Keep `skipped_in_a_row` for a step's updates in order (False: skipped, for a non-finite
        loss or gradient or a huge norm): each skipped update adds one, an applied update resets
        it. So the count is of updates, whatever algo.updates_per_step, and a step that skips one
        mini-batch and applies the next breaks the run of skips."""
        for ok in applied:
            self.skipped_in_a_row = 0 if ok else self.skipped_in_a_row + 1

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
            "best": self.best,
            "data_fingerprint": self.data_fingerprint,
            "rollout_n": self.buffer.group_size,
            "readmit_queue": list(self.readmit_queue),
            "python_random": [version, list(mt), gauss],
            "numpy_random": {
                "name": name,
                "keys": np.asarray(keys).tolist(),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached": float(cached),
            },
        }

    def load_state_dict(self, state: dict[str, Any], new_data: bool = False) -> None:
        """`new_data` (trainer.resume_new_data): the questions differ from the checkpoint's, so
        the sampler's saved order (indices into the old pool) is not loaded: it starts afresh."""
        self.step = int(state["step"])
        if not new_data:
            self.sampler.load_state_dict(state["sampler"])
        self.switch.load_state_dict(state["delayed_start"])
        self.skipped_in_a_row = int(state.get("skipped_in_a_row", 0))
        self.wandb_id = state.get("wandb_id")
        self.best = state.get("best")
        # absent before it existed; uids of the old pool mean nothing on new data
        self.readmit_queue = [] if new_data else [str(u) for u in state.get("readmit_queue", [])]
        version, mt, gauss = state["python_random"]
        random.setstate((version, tuple(mt), gauss))
        n = state["numpy_random"]
        keys = np.array(n["keys"], dtype=np.uint32)
        np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached"]))

    def digest(self) -> str:
        """A digest of what every rank must hold alike: the shared part of `state_dict` and the
        buffer's own digest (its content, stored tokens and log-probs included)."""
        shared = {k: v for k, v in self.state_dict().items() if k not in LOCAL_KEYS}
        shared["buffer"] = self.buffer.digest()
        return hashlib.blake2b(json.dumps(shared, sort_keys=True).encode(), digest_size=8).hexdigest()

    # ------------------------------------------------------------------ checkpoint files
    def save(
        self, root: Path, keep: int, tokenizer: Any, parallel: DataParallel, last: bool = False
    ) -> Path | None:
        """Write checkpoint `root/step_<step>` atomically, with a manifest of checksums (a
        collective under torchrun: every rank calls it). Returns its path on rank 0, None elsewhere.
        `last`: the run's last step, whose checkpoint also holds the merged model under model.lora."""

        def write(tmp: Path) -> None:
            # collectives first, in the same order on every rank; rank 0 alone writes the rest
            if lora.is_lora(self.model):  # the adapter; the merged model once, at the end
                lora.save_adapter(self.model, tmp / lora.ADAPTER_DIR, parallel)
                if parallel.is_main and tokenizer is not None:
                    tokenizer.save_pretrained(tmp / lora.ADAPTER_DIR)
            if not lora.is_lora(self.model) or last:
                export_hf(self.model, tmp / "model", tokenizer, parallel)
            (tmp / "optimizer").mkdir(exist_ok=True)
            optimizer_files.save_optimizer(self.model, self.optimizer, tmp / "optimizer", parallel)
            if parallel.is_main:
                ckpt.disk_fault(self.step)
                self.buffer.save(str(tmp / "replay"))
                save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
                ckpt.write_json(tmp / "trainer_state.json", self.state_dict())
                if self.trained_with:
                    ckpt.write_json(tmp / "config.json", self.trained_with)

        return ckpt.save_checkpoint(root, self.step, write, keep, parallel)

    def load(self, folder: Path, parallel: DataParallel, new_data: bool = False) -> list[str]:
        """Restore everything but the weights from checkpoint `folder` (the model was built from
        `folder/model`); the optimizer state is resharded onto this run's ranks, its
        hyper-parameters stay the config's (returns a line per value the checkpoint had otherwise).
        The buffer is read into this run's (its group size and buckets must match the config)."""
        own = own_hyper(self.optimizer)
        if lora.is_lora(self.model):  # the base came from model.path, the adapter comes from here
            lora.load_adapter(self.model, folder / lora.ADAPTER_DIR)
        if (folder / "optimizer").is_dir():
            optimizer_files.load_optimizer(self.model, self.optimizer, folder / "optimizer", parallel)
        else:  # a checkpoint written before the sharded format: one full optimizer state
            full = ckpt.optimizer_state_from_files(folder) if parallel.is_main else {}
            optimizer_files.load_full_optimizer_state_dict(self.model, self.optimizer, full, parallel)
        notes = restore_hyper(self.optimizer, own)
        self.buffer.load_state_dict(load_buffer(str(folder / "replay")))
        self.load_state_dict(ckpt.read_json(folder / "trainer_state.json"), new_data)
        torch.set_rng_state(load_file(str(folder / "rng.safetensors"))["torch"])
        return notes


def step_rng(seed: int, step: int, purpose: int) -> np.random.Generator:
    """An independent generator per (seed, step, purpose), so that a resumed run repeats a step
    exactly: no RNG state to carry across steps."""
    return np.random.default_rng([seed, step, purpose])
