"""Memory figures that Linux keeps under /proc, in bytes: the host's available memory (the start-up
check of the model's size, plan/model_bounds.py), this process's size (the chat template check's
limit, data/template_budget.py) and resident peak (the step's host memory, metrics/memory.py).
A leaf module without torch, so a forked checker can read it cheaply."""

from __future__ import annotations

MEMINFO, SELF_STATUS = "/proc/meminfo", "/proc/self/status"


def proc_bytes(path: str, field: str) -> int | None:
    """`field` of a /proc file of `Name:   <n> kB` lines, in bytes; None where it cannot be read
    (not Linux, or no such field)."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == field:
                    return int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
