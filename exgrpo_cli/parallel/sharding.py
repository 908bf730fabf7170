"""Data parallelism in one place: the one object through which every stage talks to the other ranks.

Where it sits: built once by `parallel/fsdp.init_distributed` (or `DataParallel()` for one
process) and handed to every stage that has work to split or a decision to share: the step's
rollout, grading and update, validation's chunks, the replay candidates' scores, checkpoints and
the resume decision. Nothing outside policy/ imports torch.distributed: the primitives under this
object are the module's own (`all_gather_object`, `broadcast_object`, `all_reduce_dict`, which
tests replace by threads), and every caller asks the object.

Every rank holds the same questions, buffer and sampler position and runs the same step; work is
cut by `mine` (rank r takes items r, r+W, r+2W, ...), each rank computes its share, and `map` /
`merge` give every rank every share's results, keyed as one process would have them, in one
all-gather. `check_agree` fails the run at once when the ranks' shared state diverged; `mean`,
`max`, `sum`, `any` and `from_main` turn per-rank values into run-wide ones.

The equal-call rule, stated once (`equal_calls`): under FSDP every forward and generation is a
collective, so every rank makes as many calls as the rank with the most, a rank out of work
running idle ones.

One process (a world of one): nothing is exchanged. `mine(n)` is every item, `equal_calls(n)` is
n, `done_after(k, n)` is min(k, n) and `seed(s)` is s; `gather` returns [its input], `merge` its
input, the reductions and `from_main` their input; `check_agree` and `barrier` do nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

import torch

from exgrpo_cli.errors import UsageError

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")
CPU = torch.device("cpu")


@dataclass
class Merged(Generic[K, V]):
    """Every rank's results and counters, as one process would have them."""

    items: dict[K, V]
    counts: dict[str, int] = field(default_factory=dict)  # summed over the ranks

    def in_order(self, n: int) -> list[V]:
        """items[0], ..., items[n-1]. Every index must have come back from some rank: one that
        did not means the work was split wrong, and raises."""
        items = cast(dict[int, V], self.items)
        missing = [i for i in range(n) if i not in items]
        if missing:
            raise RuntimeError(
                f"no rank returned results for indices {missing[:10]} of {n} "
                f"({len(missing)} missing): a bug in how the work was split over the ranks"
            )
        return [items[i] for i in range(n)]


@dataclass(frozen=True)
class DataParallel:
    """This process's place among the ranks (`rank` of `world_size`, its compute `device`) and
    everything the ranks exchange."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = CPU

    @classmethod
    def of_process_group(cls, device: torch.device = CPU) -> DataParallel:
        """The default process group's rank and size as torch.distributed has it (one process
        without one), computing on `device`: for parts built without the run's object (the rollout
        engines, which may serve `exgrpo eval`'s ranks as well as the trainer's)."""
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized():
            return cls(tdist.get_rank(), tdist.get_world_size(), device=device)
        return cls(device=device)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ the split
    def mine(self, n: int) -> list[int]:
        """This rank's items of n: r, r+W, ... (an equal share, within one, and the same items
        whatever the order in which ranks finish)."""
        return list(range(self.rank, n, self.world_size))

    def rounds(self, n: int) -> int:
        """The largest share of n items: `equal_calls` of a rank that makes one call per item,
        known without asking the others."""
        return -(-n // self.world_size)

    def equal_calls(self, n: int) -> int:
        """The equal-call rule: how many calls every rank makes when each call is a collective (an
        FSDP-sharded model's forward or generation) and this rank needs `n`: the most any rank
        needs. A rank with fewer runs idle calls (one small all-reduce)."""
        if not self.distributed:
            return n
        return int(self.max({"n": float(n)})["n"])

    def done_after(self, rounds: int, n: int) -> int:
        """Items of n the ranks have finished together after `rounds` items each."""
        return min(rounds * self.world_size, n)

    def seed(self, seed: int) -> int:
        """This rank's seed of a stream each rank draws its own share from: `seed` + rank, so the
        ranks sample differently and rank 0 (and a world of one) uses `seed` itself."""
        return seed + self.rank

    # ------------------------------------------------------------------ putting it together
    def map(self, work: Callable[[list[T]], Sequence[V]], items: Sequence[T]) -> list[V]:
        """`work` of this rank's share of `items` (one call; one result per item, in order),
        every rank's results in `items`' order on every rank."""
        return self.map_counted(lambda share: (work(share), {}), items)[0]

    def map_counted(
        self, work: Callable[[list[T]], tuple[Sequence[V], dict[str, int]]], items: Sequence[T]
    ) -> tuple[list[V], dict[str, int]]:
        """`map` for a `work` that also counts things (timeouts, errors): the results in order,
        and each count summed over the ranks. One all-gather."""
        mine = self.mine(len(items))
        out, counts = work([items[i] for i in mine])
        if len(out) != len(mine):
            raise RuntimeError(f"a share of {len(mine)} items gave {len(out)} results")
        merged = self.merge(dict(zip(mine, out)), **counts)
        return merged.in_order(len(items)), merged.counts

    def gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order (one all-gather; pickled, keep it small)."""
        if not self.distributed:
            return [obj]
        return all_gather_object(obj, self)

    def merge(self, part: Mapping[K, V], **counts: int) -> Merged[K, V]:
        """Every rank's `part` (its share's results by key) in one dict, and `counts` summed over
        the ranks, in one all-gather. A key two ranks both returned is a split bug: raises."""
        if not self.distributed:
            return Merged(dict(part), dict(counts))
        items: dict[K, V] = {}
        total = dict.fromkeys(counts, 0)
        for rank, (p, c) in enumerate(self.gather((dict(part), counts))):
            twice = items.keys() & p.keys()
            if twice:
                clash = sorted(map(str, twice))[:5]
                raise RuntimeError(f"rank {rank} returned results another rank returned too: {clash}")
            items.update(p)
            for k in total:
                total[k] += c[k]
        return Merged(items, total)

    def check_agree(self, digest: Callable[[], str], step: int) -> None:
        """Every rank must hold the same shared state (`digest()`: the run state's, step/state.py,
        computed only when there are ranks to compare): they pick the same replay questions from
        it, and the candidate scoring is a collective forward. Diverged ranks would hang in it
        (until trainer.dist_timeout_s) or train on mismatched batches; this fails the run at once
        with a message instead. One small all-gather."""
        if not self.distributed:
            return
        digests = self.gather(digest())
        if any(d != digests[0] for d in digests):
            raise RuntimeError(
                f"step {step}: the ranks' replay buffers / sampler / delayed-start states "
                f"diverged (digest per rank: {digests})"
            )

    # ------------------------------------------------------------------ run-wide values
    def mean(self, values: Mapping[str, float]) -> dict[str, float]:
        """The ranks' mean of each value (every rank passes the same keys)."""
        return self._reduce(values, "mean")

    def max(self, values: Mapping[str, float]) -> dict[str, float]:
        """The largest rank's value of each."""
        return self._reduce(values, "max")

    def sum(self, values: Mapping[str, float]) -> dict[str, float]:
        """The ranks' sum of each value."""
        return self._reduce(values, "sum")

    def any(self, flag: bool) -> bool:
        """Whether any rank's `flag` is set: a decision every rank must take alike."""
        return bool(self.max({"flag": float(flag)})["flag"])

    def from_main(self, value: T) -> T:
        """Rank 0's `value` on every rank: rank 0 decides (pickled, keep it small)."""
        return value if not self.distributed else broadcast_object(value, self)

    def fill_from_main(self, tensor: torch.Tensor) -> None:
        """Rank 0's values into `tensor`, in place on every rank (a tensor collective, no pickling)."""
        if self.distributed:
            torch.distributed.broadcast(tensor, src=0)

    def barrier(self) -> None:
        """Every rank waits here for the others (e.g. until rank 0 has written what they read)."""
        if self.distributed:
            torch.distributed.barrier()

    def main_first(self, load: Callable[[], T]) -> T:
        """`load()` on rank 0, then on the other ranks once rank 0 is done (a download lands in
        the shared cache once). Rank 0's failure is every rank's: the others raise it too, without
        trying."""
        if not self.distributed:
            return load()
        if self.is_main:
            try:
                result = load()
            except Exception as err:
                self.from_main(f"{type(err).__name__}: {err}")
                raise
            self.from_main(None)
            return result
        failed = self.from_main(None)
        if failed:
            raise UsageError(f"rank 0 could not load it: {failed}")
        return load()

    def _reduce(self, values: Mapping[str, float], op: str) -> dict[str, float]:
        return dict(values) if not self.distributed else all_reduce_dict(dict(values), self, op=op)


# ------------------------------------------------------------------ the primitives under it
# (module functions so that tests can stand threads in for the ranks)


def broadcast_object(obj: T, parallel: DataParallel, src: int = 0) -> T:
    """`obj` as rank `src` holds it, on every rank (pickled: keep it small, e.g. a question list)."""
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: T, parallel: DataParallel) -> list[T]:
    """Every rank's `obj`, in rank order, on every rank (pickled: e.g. this rank's scored groups)."""
    out: list[Any] = [None] * parallel.world_size
    torch.distributed.all_gather_object(out, obj)
    return out


def all_reduce_dict(values: dict[str, float], parallel: DataParallel, op: str = "mean") -> dict[str, float]:
    """Reduce many scalars in one collective (op: mean | sum | max | min). Every rank must pass
    the same keys; the key count travels along so that a mismatch fails loudly here instead of
    silently mixing up metrics."""
    import torch.distributed as tdist

    keys = sorted(values)
    ops = {
        "mean": tdist.ReduceOp.SUM,
        "sum": tdist.ReduceOp.SUM,
        "max": tdist.ReduceOp.MAX,
        "min": tdist.ReduceOp.MIN,
    }
    buf = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=parallel.device)
    # max of (n, -n) over ranks: n_max and -n_min in one collective
    count = torch.tensor([len(keys), -len(keys)], dtype=torch.float64, device=parallel.device)
    tdist.all_reduce(count, op=tdist.ReduceOp.MAX)
    if count[0].item() != -count[1].item():
        raise RuntimeError(f"all_reduce_dict: ranks passed different metric sets (this rank: {keys})")
    tdist.all_reduce(buf, op=ops[op])
    if op == "mean":
        buf /= parallel.world_size
    return dict(zip(keys, buf.tolist()))
