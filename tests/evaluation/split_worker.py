"""One rank of the work-split check, launched by tests/evaluation/test_split.py under torchrun
(gloo, CPU): validation sampling and replay-candidate scoring, shared by the ranks, must give the
answers one process gives. Rank 0 writes them as JSON to argv[1]."""

from __future__ import annotations

import json
import sys

import torch
from split_common import run_both  # noqa: E402  (beside this file)

from exgrpo_cli.config.schema import ModelConfig
from exgrpo_cli.parallel import fsdp as D
from exgrpo_cli.parallel.process_end import ends_without_teardown
from exgrpo_cli.policy.model import load_model, load_tokenizer


def main(out: str) -> None:
    torch.set_num_threads(1)
    parallel = D.init_distributed(timeout_s=60)
    cfg = ModelConfig()
    tok, model = load_tokenizer(cfg), load_model(cfg, torch.device("cpu"))
    result = run_both(model, tok, parallel)
    if parallel.is_main:
        with open(out, "w") as fh:
            json.dump(result, fh)
    parallel.barrier()
    D.close_distributed()


if __name__ == "__main__":
    with ends_without_teardown():  # no race with gloo's threads at exit
        main(sys.argv[1])
