import math

import torch

from exgrpo_cli.algo import exgrpo_token_losses, policy_shaping


def exgrpo_policy_loss(*args: torch.Tensor, normalizer: float, **kw: float | None) -> torch.Tensor:
    """The scalar loss with the Dr.GRPO constant normaliser: token losses summed / normaliser."""
    return exgrpo_token_losses(*args, **kw)[0].sum() / normalizer  # type: ignore[arg-type]


def test_policy_shaping_values():
    w = torch.tensor([0.0, 0.1, 1.0, 9.9])
    assert torch.allclose(policy_shaping(w, 0.1), torch.tensor([0.0, 0.5, 1 / 1.1, 0.99]))


def test_replayed_token_losses_use_the_published_shaping():
    # the update's replayed tokens are -A f(w) with the very f(w) the library publishes, to the bit
    g = torch.Generator().manual_seed(0)
    logp, blogp = torch.randn(64, 16, generator=g) * 3, torch.randn(64, 16, generator=g) * 3
    adv = torch.randn(64, generator=g)
    losses, _ = exgrpo_token_losses(
        logp, blogp, adv, torch.ones(64, 16), torch.ones(64, dtype=torch.bool), clip_eps=0.2, beta=0.1
    )
    assert torch.equal(losses, -adv.unsqueeze(-1) * policy_shaping((logp - blogp).exp(), 0.1))


def _one_row(
    logp: float, blogp: float, adv: float, replay: bool, **kw: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.tensor([[logp]], requires_grad=True)
    loss = exgrpo_policy_loss(
        logp,
        torch.tensor([[blogp]]),
        torch.tensor([adv]),
        torch.ones(1, 1),
        torch.tensor([replay]),
        normalizer=1.0,
        **kw,
    )
    return loss, logp


def test_fresh_ppo_clip_exact():
    # w = e^{0.5} = 1.6487 > 1.2: with A > 0 the clipped branch (-A*1.2) is the max
    loss, _ = _one_row(0.5, 0.0, 2.0, False, clip_eps=0.2, beta=0.1)
    assert math.isclose(loss.item(), -2.0 * 1.2, rel_tol=1e-6)
    # with A < 0 the unclipped branch (-A*w) is the max
    loss, _ = _one_row(0.5, 0.0, -2.0, False, clip_eps=0.2, beta=0.1)
    assert math.isclose(loss.item(), 2.0 * math.exp(0.5), rel_tol=1e-6)


def test_fresh_without_clip_is_minus_a_w():
    loss, _ = _one_row(0.5, 0.0, 2.0, False, clip_eps=None, beta=0.1)
    assert math.isclose(loss.item(), -2.0 * math.exp(0.5), rel_tol=1e-6)


def test_replayed_shaped_exact_and_never_clipped():
    w = math.exp(0.5)
    loss, _ = _one_row(0.5, 0.0, 2.0, True, clip_eps=0.2, beta=0.1)
    assert math.isclose(loss.item(), -2.0 * w / (w + 0.1), rel_tol=1e-6)
    loss, _ = _one_row(0.5, 0.0, 2.0, True, clip_eps=0.2, beta=None)
    assert math.isclose(loss.item(), -2.0 * w, rel_tol=1e-6)


def test_shaped_gradient_matches_analytic():
    # d/dlogp [-A w/(w+b)] = -A * b w / (w+b)^2  (since dw/dlogp = w)
    a, beta, lp, blp = 1.5, 0.1, -2.0, -1.0
    w = math.exp(lp - blp)
    loss, logp = _one_row(lp, blp, a, True, clip_eps=None, beta=beta)
    loss.backward()
    assert math.isclose(logp.grad.item(), -a * beta * w / (w + beta) ** 2, rel_tol=1e-5)


def test_unshaped_gradient_is_minus_a_w():
    loss, logp = _one_row(-2.0, -1.0, 1.5, True, clip_eps=None, beta=None)
    loss.backward()
    assert math.isclose(logp.grad.item(), -1.5 * math.exp(-1.0), rel_tol=1e-5)


def test_mask_and_constant_normaliser():
    logp = torch.zeros(2, 3)
    blogp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    # w = 1 everywhere: token losses -1,-1 (row 0) and +1 (row 1); sum -1; / normaliser 6
    loss = exgrpo_policy_loss(
        logp, blogp, adv, mask, torch.tensor([False, True]), clip_eps=0.2, beta=None, normalizer=6.0
    )
    assert math.isclose(loss.item(), -1.0 / 6.0, rel_tol=1e-6)


def test_huge_log_ratio_stays_finite():
    for replay, beta in ((True, 0.1), (False, None)):
        loss, _ = _one_row(200.0, 0.0, 1.0, replay, clip_eps=None, beta=beta)
        assert torch.isfinite(loss)
    # padding positions with garbage log-probs never leak into the loss
    logp = torch.tensor([[0.0, float("nan")]])
    loss = exgrpo_policy_loss(
        logp,
        torch.zeros(1, 2),
        torch.tensor([1.0]),
        torch.tensor([[1.0, 0.0]]),
        torch.tensor([False]),
        clip_eps=0.2,
        beta=0.1,
        normalizer=1.0,
    )
    assert loss.item() == -1.0
