"""An indexed set of question ids: what each replay bucket holds.

Selection draws a few questions out of buckets that may hold a million between them; a dict-based
set would have to be copied into a list (touching every member) before it can be indexed. Here
members live in a list, with each one's position in a dict: add, remove and `member(i)` are O(1),
so drawing 64 questions touches 64 members. A removal moves the last member into the gap, so the
order is the slot order (the insertion order until the first removal); it is a pure function of
the sequence of adds and removes, and `list(s)` restores it exactly (checkpoints save it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class IndexedSet:
    __slots__ = ("_items", "_pos")

    def __init__(self, items: Iterable[str] = ()) -> None:
        self._items: list[str] = []
        self._pos: dict[str, int] = {}
        for x in items:
            self.add(x)

    def add(self, x: str) -> None:
        if x not in self._pos:
            self._pos[x] = len(self._items)
            self._items.append(x)

    def remove(self, x: str) -> None:
        """KeyError if `x` is not a member."""
        i = self._pos.pop(x)
        last = self._items.pop()
        if i < len(self._items):
            self._items[i] = last
            self._pos[last] = i

    def member(self, i: int) -> str:
        return self._items[i]

    def __contains__(self, x: object) -> bool:
        return x in self._pos

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))  # a snapshot: callers may modify the set while iterating
