"""memory/<phase>_peak_gb: the peak of a phase, reset at its start (host memory on a CPU)."""

from __future__ import annotations

import torch

from exgrpo_cli.metrics.memory import PhaseMemory


def test_a_phase_that_allocates_shows_a_higher_peak_than_one_that_does_not() -> None:
    mem = PhaseMemory(torch.device("cpu"))
    with mem("idle"):
        pass
    with mem("busy"):
        block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        block += 1
    del block
    assert set(mem) == {"memory/idle_peak_gb", "memory/busy_peak_gb"}
    assert mem["memory/busy_peak_gb"] - mem["memory/idle_peak_gb"] > 0.05  # the 64 MiB shows
    with mem("idle"):  # reset at the start: the busy phase's peak does not leak into this one
        pass
    assert mem["memory/idle_peak_gb"] < mem["memory/busy_peak_gb"] - 0.05
