"""Topology domains over ``Snapshot.levels`` and the "fewest domains" descent.

A domain at level L is identified by the values of every level from the top down to L (a
rack value may repeat across blocks), so domain keys are tuples of label values, a node's
*path*. ``kubernetes.io/hostname`` as the lowest level is the node itself: every node (and
every new node) is its own domain there, even one whose template does not know its name yet.

:func:`fill` distributes a number of pods over a tree of domains the way Kueue TAS does:
at each level it takes the fewest child domains (largest first) and, for the last one, the
tightest domain that still holds the rest (best fit), then descends into each.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

HOSTNAME = "kubernetes.io/hostname"

T = TypeVar("T")
K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class Levels:
    """The snapshot's levels, split into domain levels and the optional node level."""

    all: tuple[str, ...]
    domain: tuple[str, ...]
    """Levels that group several nodes (everything but a trailing hostname)."""
    node_level: str | None
    """``kubernetes.io/hostname`` when it is the lowest level."""

    @classmethod
    def of(cls, levels: tuple[str, ...]) -> Levels:
        if levels and levels[-1] == HOSTNAME:
            return cls(levels, levels[:-1], HOSTNAME)
        return cls(levels, levels, None)

    def index(self, level: str) -> int:
        """Index among domain levels; ``len(domain)`` for the node level."""
        if level == self.node_level:
            return len(self.domain)
        return self.domain.index(level)

    def path(self, labels: Mapping[str, str]) -> tuple[str, ...]:
        """Values of the domain levels from the top while the labels have them."""
        out: list[str] = []
        for level in self.domain:
            value = labels.get(level)
            if value is None:
                break
            out.append(value)
        return tuple(out)

    def labels_of(self, key: tuple[str, ...]) -> dict[str, str]:
        return dict(zip(self.domain, key, strict=False))


def choose(groups: Sequence[tuple[K, int]], need: int, sort_key: Callable[[K], str]) -> list[
    tuple[K, int]
]:
    """Fewest groups covering ``need``, the last one the tightest that holds the remainder.

    ``groups`` are (group, capacity); returns (group, amount taken). Ties break on
    ``sort_key`` so the result never depends on input order. Requires enough total capacity.
    """
    ordered = sorted(((cap, sort_key(g), g) for g, cap in groups if cap > 0), key=lambda x: x[:2])
    caps = [cap for cap, _, _ in ordered]
    chosen: list[tuple[K, int]] = []
    rem = need
    while rem > 0:
        if not ordered:
            raise ValueError("not enough capacity to choose from")
        i = bisect_left(caps, rem)
        if i < len(caps):
            # Best fit: the smallest group (then the first by name) that holds the rest.
            chosen.append((ordered[i][2], rem))
            return chosen
        # No single group holds the rest: take a largest one (first by name among equals).
        j = bisect_left(caps, caps[-1])
        cap, _, group = ordered.pop(j)
        caps.pop(j)
        chosen.append((group, cap))
        rem -= cap
    return chosen


def fill(
    leaves: Sequence[T],
    need: int,
    depth: int,
    *,
    path: Callable[[T], tuple[str, ...]],
    cap: Callable[[T], int],
    name: Callable[[T], str],
) -> list[tuple[T, int]]:
    """Distribute ``need`` pods over ``leaves`` (all inside one domain at ``depth - 1``),
    taking the fewest child domains at each level down to single leaves."""
    subgroups: dict[str, list[T]] = {}
    singles: list[T] = []
    for leaf in leaves:
        p = path(leaf)
        if len(p) > depth:
            subgroups.setdefault(p[depth], []).append(leaf)
        else:
            singles.append(leaf)
    groups: list[tuple[tuple[str, str], int]] = []
    for value, members in subgroups.items():
        groups.append((("d", value), sum(cap(m) for m in members)))
    by_name: dict[str, T] = {}
    for leaf in singles:
        n = name(leaf)
        by_name[n] = leaf
        groups.append((("n", n), cap(leaf)))
    out: list[tuple[T, int]] = []
    for (kind, value), amount in choose(groups, need, sort_key=lambda g: g[0] + g[1]):
        if kind == "n":
            out.append((by_name[value], amount))
        else:
            out.extend(fill(subgroups[value], amount, depth + 1, path=path, cap=cap, name=name))
    return out
