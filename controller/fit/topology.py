"""Topology domains over ``Snapshot.levels`` and the "fewest domains" descent.

A domain at level L is identified by the values of every level from the top down to L (a
rack value may repeat across blocks), so domain keys are tuples of label values, a node's
*path*. ``kubernetes.io/hostname`` as the lowest level is the node itself: every node (and
every new node) is its own domain there, even one whose template does not know its name yet.

Each node is read for the levels it has: one hierarchy may span clouds (GCE's block and
EC2's network node layers under one zone level), and a node lacks the other cloud's levels.
A level a node lacks above one it has is :data:`ABSENT` in its path; the node is in no
domain at that level (:func:`within`) but still in those below, as the kube-scheduler
matches a domain by the node's labels. A path ends at the lowest level the node has.

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

NEW_HOSTNAME = "~unnamed"
"""The hostname label of a node a pool would add, while matching selectors: every node has
one (its kubelet sets it), but a new node's name is not known, so no ``In`` value or
nodeSelector names it. Not a valid label value, so it equals none. Never reported as a
domain: a new node's own domain at the hostname level is its slot."""

ABSENT = "~absent"
"""A path's value at a level the node (or a pool's domain) lacks above one it has. Not a
valid label value, so it equals none; never reported as a domain or a label."""

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
        """Values of the domain levels from the top down to the lowest the labels have,
        :data:`ABSENT` for a level they lack above it."""
        return domain_path(labels, self.domain)

    def labels_of(self, key: tuple[str, ...]) -> dict[str, str]:
        """The labels a domain key stands for (the levels its nodes lack left out)."""
        return {level: v for level, v in zip(self.domain, key, strict=False) if v != ABSENT}


def domain_path(labels: Mapping[str, str], levels: Sequence[str]) -> tuple[str, ...]:
    """See :meth:`Levels.path`."""
    out = [labels.get(level, ABSENT) for level in levels]
    while out and out[-1] == ABSENT:
        out.pop()
    return tuple(out)


def within(path: tuple[str, ...], depth: int) -> bool:
    """The path is in a domain at domain-level index ``depth`` (it has that level)."""
    return len(path) > depth and path[depth] != ABSENT


def choose(
    groups: Sequence[tuple[K, int, int]], need: int, sort_key: Callable[[K], str]
) -> list[tuple[K, int, int]]:
    """Fewest units covering ``need``; the last one the tightest that holds the remainder.

    ``groups`` are (group, capacity of one unit, number of identical units): a domain is one
    unit, a node class has one unit per member node. Returns (group, amount per unit, units
    taken). Ties break on ``sort_key`` so the result never depends on input order. The
    caller guarantees enough total capacity.
    """
    ordered = sorted(
        ((cap, sort_key(g), g, units) for g, cap, units in groups if cap > 0 and units > 0),
        key=lambda x: (x[0], x[1]),
    )
    caps = [x[0] for x in ordered]
    left = [x[3] for x in ordered]
    chosen: list[tuple[K, int, int]] = []
    rem = need
    while rem > 0:
        if not ordered:
            raise ValueError("not enough capacity to choose from")
        i = bisect_left(caps, rem)
        if i < len(caps):
            # Best fit: the smallest unit (then the first by name) that holds the rest.
            chosen.append((ordered[i][2], rem, 1))
            return chosen
        # No unit holds the rest: take whole units of a largest group (first by name).
        j = bisect_left(caps, caps[-1])
        cap, group, units = caps[j], ordered[j][2], left[j]
        k = min(units, rem // cap)
        chosen.append((group, cap, k))
        rem -= k * cap
        if k == units:
            ordered.pop(j)
            caps.pop(j)
            left.pop(j)
        else:
            left[j] = units - k
    return chosen


def fill(
    items: Sequence[T],
    need: int,
    depth: int,
    *,
    path: Callable[[T], tuple[str, ...]],
    per_node: Callable[[T], int],
    nodes: Callable[[T], int],
    name: Callable[[T], str],
) -> list[tuple[T, int, int]]:
    """Distribute ``need`` pods over node classes ``items`` (all inside one domain at
    ``depth - 1``), taking the fewest child domains at each level and then the fewest
    nodes. Returns (item, pods per node, nodes)."""
    subgroups: dict[str, list[T]] = {}
    groups: list[tuple[tuple[str, str], int, int]] = []
    singles: dict[str, T] = {}
    for item in items:
        p = path(item)
        if within(p, depth):
            subgroups.setdefault(p[depth], []).append(item)
        else:
            n = name(item)
            singles[n] = item
            groups.append((("n", n), per_node(item), nodes(item)))
    for value, members in subgroups.items():
        groups.append((("d", value), sum(per_node(m) * nodes(m) for m in members), 1))
    out: list[tuple[T, int, int]] = []
    for (kind, value), amount, units in choose(groups, need, sort_key=lambda g: g[0] + g[1]):
        if kind == "n":
            out.append((singles[value], amount, units))
        else:
            out.extend(
                fill(subgroups[value], amount, depth + 1, path=path, per_node=per_node,
                     nodes=nodes, name=name)
            )
    return out
