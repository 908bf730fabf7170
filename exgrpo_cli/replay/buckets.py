"""Bucket geometry of the replay buffer (docs/algorithm.md §2): which accuracy range each bucket
covers, the bucket of a level out of K (the success count k under `replay.bucket_by=count`, a
normalised reward std under `reward_std`: replay/bucketing.py), and each bucket's centre (what the
Gaussian question selection weighs).

Place in the train step: pure and fixed for a run; the buffer files each observed group into
`bucket_of_count(k)`, and selection reads `centres`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence


def default_bucket_edges(group_size: int) -> list[float]:
    """Edges halfway between success counts: bucket b holds exactly the count k = b + 1."""
    return [(k + 0.5) / group_size for k in range(1, group_size - 1)]


class BucketScheme:
    """Buckets as ranges [e_i, e_i+1) of accuracy k/K, from `bucket_edges` (None: one per count)."""

    def __init__(
        self, group_size: int, bucket_edges: Sequence[float] | None = None, min_level: int = 1
    ) -> None:
        if group_size < 2:
            raise ValueError(f"group_size must be >= 2 (got {group_size}): K=1 has no partial accuracy")
        edges = default_bucket_edges(group_size) if bucket_edges is None else [float(e) for e in bucket_edges]
        if not all(0.0 < e < 1.0 for e in edges) or any(a >= b for a, b in zip(edges, edges[1:])):
            raise ValueError(f"replay.bucket_edges must be increasing values inside (0, 1) (got {edges})")
        self.group_size = group_size
        self.edges = edges
        self.user_edges = None if bucket_edges is None else edges  # what a checkpoint records
        # the levels a stored question can have: 1..K-1 (counts), or 0..K (min_level 0)
        self.levels = range(min_level, group_size + 1 - min_level)
        # bucket of each level (-1: none); bisect_right makes ranges [e_i, e_i+1)
        self._count_bucket = [
            bisect_right(edges, k / group_size) if k in self.levels else -1 for k in range(group_size + 1)
        ]
        bounds = [0.0, *edges, 1.0]
        self.centres: list[float] = []
        for b in range(len(edges) + 1):
            accs = [k / group_size for k in self.levels if self._count_bucket[k] == b]
            # A bucket holding no count can never fill; its midpoint is a harmless placeholder.
            self.centres.append(sum(accs) / len(accs) if accs else (bounds[b] + bounds[b + 1]) / 2)

    @property
    def num_buckets(self) -> int:
        return len(self.centres)

    def bucket_of_count(self, k: int) -> int:
        """The bucket of level k (a success count under bucket_by=count)."""
        if k not in self.levels:
            raise ValueError(
                f"success count must be in {self.levels.start}..{self.levels.stop - 1} (got {k})"
            )
        return self._count_bucket[k]
