"""The optimizer's hyper-parameters at resume: the config's, never the checkpoint's.

Where it sits: at resume (step/state.py `RunState.load`), around the load of the optimizer state.
A checkpoint's `optimizer/param_groups.json` is data from whoever wrote the run: it is checked
(only the optimizer's own keys, numbers and flags) and then only compared with the config, so that
`algo.lr`, `algo.weight_decay` and `algo.betas` given on the command line of a resumed run apply
(the recorded config shows them) and a crafted file cannot set a flag such as `maximize`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

# compared and reported when the checkpoint's value differs from the config's
COMPARED = ("lr", "betas", "weight_decay", "eps")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_saved_groups(saved: Any, optimizer: torch.optim.Optimizer) -> None:
    """Raise ValueError unless `saved` (param_groups.json) is a list of one dict per param group
    with only this optimizer's keys, each a finite number, a bool, None or a list of numbers."""
    groups = optimizer.param_groups
    if not isinstance(saved, list) or len(saved) != len(groups):
        raise ValueError(f"param_groups.json is not a list of {len(groups)} param groups")
    for group, hyper in zip(groups, saved):
        if not isinstance(hyper, dict):
            raise ValueError("param_groups.json holds a param group that is not a mapping")
        unknown = sorted(set(hyper) - set(group))
        if unknown:
            raise ValueError(f"param_groups.json sets keys this optimizer has not: {unknown[:5]}")
        for key, v in hyper.items():
            ok = key == "params" or v is None or isinstance(v, bool) or _number(v)
            ok = ok or (isinstance(v, list) and len(v) <= 4 and all(_number(x) for x in v))
            if not ok:
                raise ValueError(f"param_groups.json: {key} is not a number or a flag")


def own_hyper(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The optimizer's hyper-parameters as the config built them (before a checkpoint loads)."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def restore_hyper(optimizer: torch.optim.Optimizer, own: list[dict[str, Any]]) -> list[str]:
    """Put the config's hyper-parameters `own` back after a load (dropping any key the load
    added); returns a line per COMPARED value that the checkpoint had otherwise."""
    notes = []
    for i, (group, mine) in enumerate(zip(optimizer.param_groups, own)):
        for key in COMPARED:
            saved, wanted = group.get(key), mine.get(key)
            if isinstance(wanted, (tuple, list)):
                same = isinstance(saved, (tuple, list)) and tuple(saved) == tuple(wanted)
            else:
                same = saved == wanted
            if key in mine and saved is not None and not same:
                notes.append(
                    f"optimizer group {i}: {key}={wanted} from the config (the checkpoint had {saved})"
                )
        for key in [k for k in group if k != "params" and k not in mine]:
            del group[key]
        group.update(mine)
    return notes
