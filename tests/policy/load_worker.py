"""One rank of the sharded-loading check, launched by tests/policy/test_fsdp.py under torchrun
(gloo, CPU): rank 0 alone reads the weights, rank 1 never opens a model file, and both end with
the model rank 0 saved; then the optimizer state is written sharded for the parent process to
load on one rank. Rank 0 writes a JSON report to argv[1]; any failed check raises."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from fsdp_worker import build, full, gathered_weights, mean_token_nll  # noqa: E402  (the tests folder is on sys.path)
from safetensors.torch import save_file

from exgrpo_cli.checkpoint import optimizer_files
from exgrpo_cli.config.schema import ModelConfig
from exgrpo_cli.parallel import fsdp as D
from exgrpo_cli.parallel.process_end import ends_without_teardown
from exgrpo_cli.policy.model import load_sharded

STOP_IDS = [2, 7]


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    parallel = D.init_distributed(timeout_s=60)
    folder = out / "model"
    if parallel.is_main:
        saved_model = build()
        # a stop id that only generation_config.json holds (as a chat model's <|im_end|>)
        saved_model.generation_config.eos_token_id = STOP_IDS
        saved_model.save_pretrained(folder)  # the weights every rank must end with
    parallel.barrier()

    opened: list[str] = []
    if not parallel.is_main:  # rank 1 records every file Python opens, and may not load a model
        sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" else None)
        import transformers

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("rank 1 loaded a model from files")

        transformers.AutoModelForCausalLM.from_pretrained = refuse  # type: ignore[method-assign]
    model = load_sharded(ModelConfig(path=str(folder)), parallel, lambda m: D.wrap_fsdp2(m, parallel))
    assert not [p for p in opened if p.startswith(str(folder))], opened
    got = model.generation_config.eos_token_id
    assert got == STOP_IDS, f"rank {parallel.rank} stops on {got}, not generation_config.json's {STOP_IDS}"

    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 512, (2, 16), generator=gen)
    loss = mean_token_nll(model, ids)  # a collective forward: buffers (RoPE) and weights in place
    reference = float(mean_token_nll(build(), ids))
    assert abs(float(loss) - reference) < 1e-5, (float(loss), reference)
    sd = gathered_weights(model, parallel)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss.backward()
    opt.step()
    optimizer_files.save_optimizer(model, opt, out / "optimizer", parallel)
    # AdamW's full state by the one-process layout's parameter ids, gathered (a collective)
    moments = {f"{i}.{k}": full(v) for i, p in enumerate(model.parameters()) for k, v in opt.state[p].items()}
    weights = {n: full(p.detach()).clone() for n, p in model.named_parameters()}
    if parallel.is_main:
        saved = build().state_dict()
        assert set(sd) == set(saved) and all(torch.equal(sd[k], saved[k]) for k in saved)
        # what a one-rank resume must find: the weights after the step and AdamW's full state
        save_file({n: w.contiguous() for n, w in weights.items()}, str(out / "weights.safetensors"))
        save_file({k: v.contiguous() for k, v in moments.items()}, str(out / "optimizer_full.safetensors"))
        (out / "report.json").write_text(json.dumps({"loss": float(loss), "reference": reference}))
    parallel.barrier()
    D.close_distributed()


if __name__ == "__main__":
    with ends_without_teardown():  # no race with gloo's threads at exit
        main(sys.argv[1])
