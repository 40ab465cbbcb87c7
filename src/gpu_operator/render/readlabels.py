"""A node's labels that note which keys were ever read, so that a render can be reused while only
labels no render reads have changed.

Why: during a rollout every node's labels change several times (our deploy labels, GPU feature
discovery's, the MIG manager's state, the driver upgrade state), and each change gave the
ClusterPolicy pass new facts and a new render (427 renders in a 1,000-node rollout, each walking
every node), although the renderer reads a few dozen keys of them. The renderer is pure: run
again on facts whose every read key has the same value (and every other field is equal), it reads
the same keys and returns the same objects. So `same_read_labels(old, new)` holds the old render
valid without knowing which keys the renderer reads: it learns them. Keys read are noted for
every node and every caller (a superset of what any one render read: more keys compared, never
fewer), and anything that walks the labels as a whole (iteration, len, items, a comparison with a
plain mapping) turns the shortcut off for good: then every label counts, as before."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar


class ReadLabels(Mapping[str, str]):
    """Read-only labels of one node (a wrapper of the view's dict, not a copy)."""

    __slots__ = ("raw",)
    raw: Mapping[str, str]
    keys_read: ClassVar[set[str]] = set()
    walked: ClassVar[bool] = False  # something read the labels as a whole

    def __init__(self, raw: Mapping[str, str]) -> None:
        self.raw = raw.raw if isinstance(raw, ReadLabels) else raw

    def __getitem__(self, key: str) -> str:
        ReadLabels.keys_read.add(key)
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        ReadLabels.keys_read.add(key)
        return self.raw.get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            ReadLabels.keys_read.add(key)
        return key in self.raw

    def __iter__(self) -> Iterator[str]:
        ReadLabels.walked = True
        return iter(self.raw)

    def __bool__(self) -> bool:  # `labels or {}`: whether there are any (same_read_labels compares it)
        return bool(self.raw)

    def __len__(self) -> int:
        ReadLabels.walked = True
        return len(self.raw)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ReadLabels):
            return self.raw == other.raw
        ReadLabels.walked = True
        return bool(self.raw == other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ReadLabels({self.raw!r})"


def forget() -> None:
    """Start again from nothing read and nothing walked (for tests, which share one process)."""
    ReadLabels.keys_read = set()
    ReadLabels.walked = False


def same_read_labels(old: Mapping[str, str], new: Mapping[str, str]) -> bool:
    """Whether two nodes' labels agree on every key ever read (on all of them once any code has
    walked labels as a whole, or where either is not a `ReadLabels`)."""
    if old is new:
        return True
    if ReadLabels.walked or not isinstance(old, ReadLabels) or not isinstance(new, ReadLabels):
        return old == new
    a, b = old.raw, new.raw
    if a is b:
        return True
    return bool(a) == bool(b) and all(a.get(key) == b.get(key) for key in tuple(ReadLabels.keys_read))
