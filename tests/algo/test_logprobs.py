import math
from collections.abc import Callable

import pytest
import torch

from exgrpo_cli.algo import masked_mean, token_entropy, token_logprobs
from exgrpo_cli.algo.logprobs import chunked_token_logprobs


def test_uniform_logits_entropy_is_log_v():
    logits = torch.zeros(2, 3, 8)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    ent = masked_mean(token_entropy(logits), mask)
    assert math.isclose(ent[0].item(), math.log(8), rel_tol=1e-6)
    assert ent[1].item() == 0.0  # no token: 0, not nan


def test_entropy_exact_two_way_with_temperature():
    # logits [log 3, 0] at T=1: p = (3/4, 1/4)
    logits = torch.tensor([[[math.log(3.0), 0.0]]])
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert math.isclose(masked_mean(token_entropy(logits), torch.ones(1, 1)).item(), h, rel_tol=1e-6)
    # T = 2 halves the logits: p = (sqrt3, 1) / (sqrt3 + 1)
    p = math.sqrt(3) / (math.sqrt(3) + 1)
    h2 = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert math.isclose(masked_mean(token_entropy(logits, 2.0), torch.ones(1, 1)).item(), h2, rel_tol=1e-6)


def test_masked_mean_over_tokens():
    logits = torch.stack([torch.zeros(4), torch.tensor([100.0, 0, 0, 0])]).view(1, 2, 4)
    ent = masked_mean(token_entropy(logits), torch.tensor([[1, 1]]))
    assert math.isclose(ent.item(), math.log(4) / 2, rel_tol=1e-5)


def test_token_logprobs_match_log_softmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g)
    targets = torch.randint(0, 11, (2, 5), generator=g)
    ref = torch.log_softmax(logits / 0.7, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets, 0.7), ref, atol=1e-6)


def _reference(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple:
    logits = hidden @ weight.t()
    return token_logprobs(logits, targets, temperature), token_entropy(logits, temperature)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_logprobs_and_entropy_equal_the_full_logits(chunk: int, temperature: float) -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, generator=g, dtype=torch.float32)
    weight = torch.randn(11, 5, generator=g, dtype=torch.float32)
    targets = torch.randint(0, 11, (7,), generator=g)
    # weights of the two outputs in the loss, as the update uses them (log-probs and a bonus)
    w_lp, w_ent = torch.randn(7, generator=g), torch.randn(7, generator=g)

    def run(fn: Callable[[torch.Tensor, torch.Tensor], tuple]) -> tuple:
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        lp, ent = fn(h, w)
        ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
        return lp.detach(), ent.detach(), h.grad, w.grad

    ref = run(lambda h, w: _reference(h, w, targets, temperature))
    got = run(
        lambda h, w: chunked_token_logprobs(
            h, w, targets, temperature=temperature, chunk_tokens=chunk, with_entropy=True
        )
    )
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_chunked_logprobs_without_entropy_and_without_grad() -> None:
    g = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(4, 3, generator=g), torch.randn(6, 3, generator=g)
    targets = torch.tensor([0, 5, 2, 2])
    with torch.no_grad():
        lp, ent = chunked_token_logprobs(hidden, weight, targets, chunk_tokens=2)
    assert ent is None
    torch.testing.assert_close(lp, _reference(hidden, weight, targets, 1.0)[0], atol=1e-6, rtol=1e-6)
