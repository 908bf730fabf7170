"""Peak memory per phase of a step (`memory/<phase>_peak_gb`), to compare with the memory plan.

Where it sits: around the step's stages (step/loop.py), like the timers. On a GPU it is the
peak of torch's allocator on this rank's device during the phase (reset at its start); on a CPU
it is the process's peak resident memory during the phase (Linux: VmHWM, reset through
/proc/self/clear_refs), which also counts what is not torch's (the Python heap, the reward
workers are other processes and are not counted).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from exgrpo_cli.host import SELF_STATUS, proc_bytes

GB = 2**30
_CLEAR = Path("/proc/self/clear_refs")


def host_status_bytes(field: str = "VmHWM") -> int | None:
    """A memory field of /proc/self/status in bytes (VmHWM: the resident peak since the last
    `reset_host_peak`; VmRSS: resident now); None where it cannot be read (not Linux)."""
    return proc_bytes(SELF_STATUS, field)


def reset_host_peak() -> bool:
    """Set VmHWM back to the current resident size (Linux >= 4.0); False where that is refused."""
    try:
        _CLEAR.write_text("5")
        return True
    except OSError:
        return False


class PhaseMemory(dict[str, float]):
    """`with memory("update"): ...` records `memory/update_peak_gb` (the largest of repeated phases)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.cuda = device.type == "cuda"
        self.device = device

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            yield
            peak: int | None = torch.cuda.max_memory_allocated(self.device)
        else:
            resettable = reset_host_peak()
            yield
            peak = host_status_bytes() if resettable else None
        if peak is not None:
            key = f"memory/{phase}_peak_gb"
            self[key] = max(self.get(key, 0.0), peak / GB)
