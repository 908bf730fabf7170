"""Data parallelism in one place: which share of the work is this rank's, and putting it together.

Where it sits: between the train step (and validation, and the scoring of replay candidates) and
torch.distributed's primitives (policy/distributed.py). Every rank holds the same questions,
buffer and sampler position and runs the same step; the step's groups (to generate, to grade, to
train on), validation's chunks and the candidates to score are cut by `Shards.mine` (rank r takes
items r, r+W, r+2W, ...), each rank computes its share, and `Shards.merge` gives every rank every
share's results, keyed as one process would have them, in one all-gather. `check_agree` fails the
run at once when the ranks' shared state diverged, and the reductions (`mean`, `max`, `any`,
`from_main`) turn per-rank values into run-wide ones.

One process (a world of one): nothing is exchanged. `mine(n)` is every item, `rounds(n)` is n,
`done_after(k, n)` is min(k, n) and `seed(s)` is s; `gather` returns [its input], `merge` its
input (as a `Merged`), the reductions and `from_main` their input; `check_agree` does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

from exgrpo_cli.policy import distributed as D

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


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
class Shards:
    """This rank's view of the work split. `dist` needs only `rank` and `world_size`."""

    dist: D.DistInfo = field(default_factory=D.DistInfo)

    @property
    def alone(self) -> bool:
        return self.dist.world_size == 1

    # ------------------------------------------------------------------ the split
    def mine(self, n: int) -> list[int]:
        """This rank's items of n: r, r+W, ... (an equal share, within one, and the same items
        whatever the order in which ranks finish)."""
        return list(range(self.dist.rank, n, self.dist.world_size))

    def rounds(self, n: int) -> int:
        """The largest share of n items: how many calls every rank makes when each call is a
        collective (an FSDP-sharded model's forward or generation), a rank out of items included."""
        return -(-n // self.dist.world_size)

    def done_after(self, rounds: int, n: int) -> int:
        """Items of n the ranks have finished together after `rounds` items each."""
        return min(rounds * self.dist.world_size, n)

    def seed(self, seed: int) -> int:
        """This rank's seed of a stream each rank draws its own share from: `seed` + rank, so the
        ranks sample differently and rank 0 (and a world of one) uses `seed` itself."""
        return seed + self.dist.rank

    # ------------------------------------------------------------------ putting it together
    def gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order (one all-gather; pickled, keep it small)."""
        if self.alone:
            return [obj]
        return D.all_gather_object(obj, self.dist)

    def merge(self, part: Mapping[K, V], **counts: int) -> Merged[K, V]:
        """Every rank's `part` (its share's results by key) in one dict, and `counts` summed over
        the ranks, in one all-gather. A key two ranks both returned is a split bug: raises."""
        if self.alone:
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
        """Every rank must hold the same shared state (`digest()`: the run state's, train/state.py,
        computed only when there are ranks to compare):
        they pick the same replay questions from it, and the candidate scoring is a collective
        forward. Diverged ranks would hang in it (until trainer.dist_timeout_s) or train on
        mismatched batches; this fails the run at once with a message instead. One small
        all-gather."""
        if self.alone:
            return
        digests = self.gather(digest())
        if any(d != digests[0] for d in digests):
            raise RuntimeError(
                f"step {step}: the ranks' replay buffers / sampler / delayed-start states "
                f"diverged (digest per rank: {digests})"
            )

    # ------------------------------------------------------------------ run-wide scalars
    def mean(self, values: Mapping[str, float]) -> dict[str, float]:
        """The ranks' mean of each value (every rank passes the same keys)."""
        return self._reduce(values, "mean")

    def max(self, values: Mapping[str, float]) -> dict[str, float]:
        """The largest rank's value of each."""
        return self._reduce(values, "max")

    def any(self, flag: bool) -> bool:
        """Whether any rank's `flag` is set: a decision every rank must take alike."""
        return bool(self.max({"flag": float(flag)})["flag"])

    def from_main(self, value: T) -> T:
        """Rank 0's `value` on every rank: rank 0 decides (pickled, keep it small)."""
        return value if self.alone else D.broadcast_object(value, self.dist)

    def _reduce(self, values: Mapping[str, float], op: str) -> dict[str, float]:
        return dict(values) if self.alone else D.all_reduce_dict(dict(values), self.dist, op=op)
