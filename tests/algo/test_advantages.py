import pytest
import torch

from exgrpo_cli.algo import group_advantages


def test_group_mean_baseline_exact():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv = group_advantages(rewards, groups)
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5, 0.25, 0.25, -0.75, 0.25]


def test_interleaved_groups_and_uniform_group_is_zero():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 1, 0, 1])
    assert group_advantages(rewards, groups).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_scale_by_std_uses_sample_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv = group_advantages(rewards, torch.zeros(4, dtype=torch.long), scale_by_std=True)
    std = torch.tensor([1.0, 0.0, 0.0, 0.0]).std()  # unbiased, 0.5
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]) / (std + 1e-6))


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))
