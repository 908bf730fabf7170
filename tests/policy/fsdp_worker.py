"""One rank of the FSDP2 check, launched by tests/policy/test_fsdp.py under torchrun (gloo, CPU).

Every rank builds the same random Qwen2 twice: an FSDP2-sharded copy trained on this rank's own
slice of the batch, and a plain reference trained on the whole batch (the concatenation of every
rank's slice). The sharded run must reproduce the reference: its gradients (averaged over ranks by
FSDP) equal the gradient of the mean loss over the whole batch, and its weights track the
reference's through AdamW. Rank 0 writes what it measured as JSON to argv[1]; any failed check
raises, so the job exits non-zero.
"""

from __future__ import annotations

import copy
import json
import sys
from typing import TYPE_CHECKING

import torch

from exgrpo_cli.checkpoint import optimizer_files
from exgrpo_cli.parallel import fsdp as D
from exgrpo_cli.parallel.offload import gather_full as full  # a DTensor shard's full tensor, else the tensor
from exgrpo_cli.parallel.process_end import ends_without_teardown
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.rollout.vllm_weights import named_tensors

from conftest import tiny_qwen2

if TYPE_CHECKING:
    from transformers import PreTrainedModel

STEPS, ROWS_PER_RANK, SEQ, LR = 2, 4, 24, 1e-3


def build() -> PreTrainedModel:
    # tied embeddings; drawn after torch.manual_seed(0): the same initial weights on every rank,
    # as FSDP requires
    return tiny_qwen2(vocab=512, hidden=128, layers=2, heads=4, kv_heads=2, positions=128)


def mean_token_nll(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    # every row has the same length, so each rank's mean is over the same token count and the mean
    # over ranks of the per-rank means is the mean over the concatenated batch
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


def gathered_weights(model: torch.nn.Module, parallel: DataParallel) -> dict[str, torch.Tensor]:
    """The full weights as plain CPU tensors under the HF names, on rank 0 (`{}` elsewhere): a
    collective under FSDP2."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = get_model_state_dict(model, options=options)
    return dict(sd) if parallel.is_main else {}


def token_objective(model: PreTrainedModel, rows: torch.Tensor, chunked: bool) -> torch.Tensor:
    """A loss over per-token log-probs and entropies of the rows' last 16 tokens (the update's
    ingredients): from the final hidden states in chunks of 7 tokens, or from the full logits."""
    from exgrpo_cli.algo.logprobs import token_entropy, token_logprobs
    from exgrpo_cli.policy.forward import forward_logprobs, pack, response_logits

    prompts = [r[:8].tolist() for r in rows]
    responses = [r[8:].tolist() for r in rows]
    sb = pack(prompts, responses, list(range(len(rows))), 0, torch.device("cpu"))
    if chunked:
        logp, ent = forward_logprobs(model, sb, with_entropy=True, chunk_bytes=7 * 4 * 512)
        assert ent is not None
    else:
        logits = response_logits(model, sb)
        logp, ent = token_logprobs(logits, sb.targets), token_entropy(logits)
    weights = torch.linspace(-1.0, 1.0, logp.shape[1])
    return ((logp * weights).sum() + 0.1 * ent.sum()) / logp.numel()


def chunked_head_under_fsdp(data: torch.Tensor, mine: torch.Tensor, parallel: DataParallel) -> float:
    """The chunked projection uses the root unit's tied embedding / head outside the model's own
    projection: its gradient under FSDP2 (this rank's rows) must equal the full-logits gradient of
    a plain model over the whole batch."""
    model, ref = D.wrap_fsdp2(build(), parallel), build()
    token_objective(model, mine, chunked=True).backward()
    token_objective(ref, data, chunked=False).backward()
    diff = max(
        float((full(p.grad) - r.grad).abs().max()) for p, r in zip(model.parameters(), ref.parameters())
    )
    assert diff < 1e-5, f"chunked log-probs under FSDP2: gradient differs by {diff}"
    return diff


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    parallel = D.init_distributed(timeout_s=60)
    assert parallel.distributed and parallel.device.type == "cpu", parallel
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, 512, (parallel.world_size * ROWS_PER_RANK, SEQ), generator=gen)
    mine = data[
        parallel.rank * ROWS_PER_RANK : (parallel.rank + 1) * ROWS_PER_RANK
    ]  # each rank: different rows

    ref = build()
    model = D.wrap_fsdp2(build(), parallel)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    names = [n for n, _ in model.named_parameters()]
    assert names == [n for n, _ in ref.named_parameters()], "FSDP2 must keep the HF parameter names"

    report: dict = {"grad_diff": [], "weight_diff": [], "grad_norm": [], "ref_grad_norm": [], "loss": []}
    for _ in range(STEPS):
        for o in (opt, ref_opt):
            o.zero_grad(set_to_none=True)
        loss = mean_token_nll(model, mine)
        loss.backward()
        mean_token_nll(ref, data).backward()
        grad_diff = max(
            float((full(p.grad) - r.grad).abs().max()) for p, r in zip(model.parameters(), ref.parameters())
        )
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        ref_norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0))
        opt.step()
        ref_opt.step()
        norms = parallel.max({"max": norm, "min": -norm})
        assert norms["max"] == -norms["min"], f"ranks disagree on the grad norm: {norms}"
        weight_diff = max(
            float((full(p.detach()) - r.detach()).abs().max())
            for p, r in zip(model.parameters(), ref.parameters())
        )
        report["grad_diff"].append(grad_diff)
        report["weight_diff"].append(weight_diff)
        report["grad_norm"].append(norm)
        report["ref_grad_norm"].append(ref_norm)
        report["loss"].append(parallel.mean({"loss": float(loss.detach())})["loss"])
        assert parallel.gather(float(loss.detach()))[parallel.rank] == float(loss.detach())
        assert grad_diff < 1e-5, f"FSDP grad differs from the single-process grad by {grad_diff}"
        assert abs(norm - ref_norm) < 1e-5 * max(1.0, ref_norm), (norm, ref_norm)
        # AdamW divides by sqrt(v): parameters with near-zero gradients amplify the ~1e-8 gradient
        # noise, hence a looser bound on the weights than on the gradients
        assert weight_diff < 1e-4, f"weights after the step differ by {weight_diff}"

    report["chunked_grad_diff"] = chunked_head_under_fsdp(data, mine, parallel)

    sd = gathered_weights(model, parallel)
    # what VLLMEngine.sync_weights streams from an FSDP2 module: one all-gather per parameter, on
    # every rank (so that each rank may feed its own colocated vLLM)
    streamed = dict(named_tensors(model))
    assert all(type(v) is torch.Tensor for v in streamed.values())
    # the sharded AdamW state, gathered (a collective): it must be the one-process reference's
    moments = {
        (i, k): full(opt.state[p][k])
        for i, p in enumerate(model.parameters())
        for k in ("exp_avg", "exp_avg_sq")
    }
    if parallel.is_main:
        assert set(streamed) == set(sd) and all(torch.equal(streamed[k], sd[k]) for k in sd)
        plain = build()
        res = plain.load_state_dict(sd, strict=True)
        assert not res.missing_keys and not res.unexpected_keys, res
        assert set(sd) == set(ref.state_dict()), set(sd) ^ set(ref.state_dict())
        assert all(type(v) is torch.Tensor and v.device.type == "cpu" for v in sd.values())
        report["state_dict_keys"] = len(sd)
        report["state_dict_diff"] = max(
            float((plain.state_dict()[k] - v).abs().max()) for k, v in ref.state_dict().items()
        )
        assert report["state_dict_diff"] < 1e-4
        ref_state = ref_opt.state_dict()["state"]
        report["optimizer_diff"] = max(
            float((m - ref_state[i][k]).abs().max()) for (i, k), m in moments.items()
        )
        assert report["optimizer_diff"] < 1e-5
    else:
        assert sd == {}, "only rank 0 receives the gathered weights"

    # resume from a checkpoint written before the sharded format: rank 0 holds the full weights and
    # the full optimizer state in the one-process layout (here the reference's own), which are
    # broadcast into a fresh sharded model and optimizer
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model2 = D.wrap_fsdp2(build(), parallel)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=LR)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model2, dict(sd) if parallel.is_main else {}, options=options)
    legacy = copy.deepcopy(ref_opt.state_dict()) if parallel.is_main else {}
    optimizer_files.load_full_optimizer_state_dict(model2, opt2, legacy, parallel)
    sd2 = gathered_weights(model2, parallel)
    ref_state = ref_opt.state_dict()["state"]
    resumed_diff = max(
        float((full(opt2.state[p][k]) - ref_state[i][k]).abs().max())
        for i, p in enumerate(model2.parameters())
        for k in ("exp_avg", "exp_avg_sq")
    )
    assert resumed_diff == 0.0, f"the resumed optimizer state differs by {resumed_diff}"
    if parallel.is_main:
        assert all(torch.equal(sd2[k], sd[k]) for k in sd)
        report["world_size"] = parallel.world_size
        with open(out_path, "w") as fh:
            json.dump(report, fh)
    parallel.barrier()
    D.close_distributed()


if __name__ == "__main__":
    with ends_without_teardown():  # no race with gloo's threads at exit
        main(sys.argv[1])
