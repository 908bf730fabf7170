"""Whether the forward gets `logits_to_keep` is read from the model's signature, once per class,
not guessed from a TypeError (which would also hide a TypeError raised inside the forward)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from exgrpo_cli.policy.forward import SequenceBatch, pack, response_logits

V = 5


def _batch() -> SequenceBatch:
    return pack([[1, 2], [3]], [[4], [1, 2, 3]], [0, 1], 0, torch.device("cpu"))


class NoKeep(torch.nn.Module):
    """A remote-code style model without logits_to_keep: it projects every position."""

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        use_cache: bool,
    ) -> SimpleNamespace:
        return SimpleNamespace(logits=torch.arange(V, dtype=torch.float32).expand(*input_ids.shape, V))


class BrokenInside(torch.nn.Module):
    """Takes logits_to_keep, and fails inside with a TypeError (a bug of its own)."""

    calls = 0

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        use_cache: bool,
        logits_to_keep: int = 0,
    ) -> SimpleNamespace:
        BrokenInside.calls += 1
        raise TypeError("unsupported operand inside the model")


def test_a_model_without_logits_to_keep_is_projected_whole_then_cut() -> None:
    sb = _batch()
    logits = response_logits(NoKeep(), sb)
    assert logits.shape == (2, 3, V)  # B rows x R response positions x V


def test_a_type_error_inside_the_forward_is_not_retried_as_a_missing_argument() -> None:
    with pytest.raises(TypeError, match="inside the model"):
        response_logits(BrokenInside(), _batch())
    assert BrokenInside.calls == 1
