"""Placement of a pod set in slices (Kueue TAS ``podset-slice-required-topology`` with
``podset-slice-size``): every consecutive ``slice_size`` pods share one domain of the slice
level, and the pod set's own topology holds as well:

* required at a coarser level (a block with rack slices): every slice whole in a rack, every
  rack used inside one block;
* preferred at some level: one domain of that level holding every slice if there is one,
  climbing to wider levels, else the slices spread over the cluster (each still whole), as
  :meth:`PodSetPlacer.place` climbs for a plain pod set;
* none: the slices anywhere, each whole.

A requirement at the slice level or finer keeps every slice whole by itself, so such a pod set
is placed as a plain one (:func:`applies`).

Slices are identical, so a domain of the slice level holds ``room // slice_size`` of them in
any order: existing capacity first (the fewest slice domains, the tightest last, as Kueue's
TAS picks), then new nodes one slice at a time wherever the next slice costs least. A slice
is never split across domains, so a fit is never reported that the slices cannot keep.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.fit.placement import PodSetPlacer
from controller.fit.purchase import Batch, Outcome, Purchase, Take, buy
from controller.fit.topology import Levels, choose, within
from controller.fit.types import TopologyMode, TopologyRequest


def applies(topo: TopologyRequest, levels: Levels) -> bool:
    """Whether the slices constrain more than the pod set's own topology does."""
    if topo.slice_level is None or topo.slice_size < 1:
        return False
    if topo.mode is TopologyMode.REQUIRED and topo.level is not None:
        return levels.index(topo.level) < levels.index(topo.slice_level)
    return True


@dataclass(frozen=True, slots=True)
class _Choice:
    existing: tuple[tuple[tuple[str, ...], int], ...]
    """(slice domain, pods) on existing nodes, for domain-level slices."""
    takes: tuple[Take, ...]
    """Existing nodes taken directly, for node-level slices."""
    purchase: Purchase
    room: int
    """Slices the existing capacity of the domain holds (the tightest domain wins)."""


def sliced_place(p: PodSetPlacer) -> Outcome | None:
    topo = p.ps.topology
    levels = p.ws.index.levels
    assert topo.slice_level is not None
    if topo.mode is TopologyMode.REQUIRED and topo.level is not None:
        depth = levels.index(topo.level)
        return _within(p, depth, allow_new=False) or _within(p, depth, allow_new=True)
    if topo.mode is TopologyMode.PREFERRED and topo.level is not None:
        depth = levels.index(topo.level)
        for allow_new in (False, True):
            for d in range(depth, -1, -1):
                got = _within(p, d, allow_new=allow_new)
                if got is not None:
                    return got
            got = _within(p, -1, allow_new=allow_new)
            if got is not None:
                return got
        return None
    return _within(p, -1, allow_new=False) or _within(p, -1, allow_new=True)


def _within(p: PodSetPlacer, depth: int, *, allow_new: bool) -> Outcome | None:
    """Every slice inside one domain at ``depth`` (-1: anywhere), or None."""
    topo = p.ps.topology
    levels = p.ws.index.levels
    assert topo.slice_level is not None
    sdepth = levels.index(topo.slice_level)
    if depth >= sdepth:
        # One domain at the slice level or finer holds every slice whole.
        if allow_new:
            return p.single_with_new(depth)
        return p.single_existing(depth)
    if allow_new and not p.batches:
        return None
    prefixes: set[tuple[str, ...]] = {()}
    if depth >= 0:
        prefixes = {cls.path[: depth + 1] for cls, _ in p.cands if within(cls.path, depth)}
        prefixes |= {b.ref.path[: depth + 1] for b in p.batches if within(b.ref.path, depth)}
    best: tuple[tuple[float, int, int, tuple[str, ...]], tuple[str, ...], _Choice] | None = None
    for prefix in sorted(prefixes):
        got = _slices_in(p, prefix, sdepth, allow_new=allow_new)
        if got is None:
            continue
        rank = ((got.purchase.cost, got.purchase.nodes, 0, prefix) if allow_new
                else (0.0, 0, got.room, prefix))
        if best is None or rank < best[0]:
            best = (rank, prefix, got)
    if best is None:
        return None
    _, prefix, choice = best
    takes = list(choice.takes)
    for key, pods in choice.existing:
        takes.extend(p.fill_in(p.members(key), pods, sdepth + 1))
    pods_out = p.commit(takes, choice.purchase if choice.purchase.takes else None)
    if depth >= 0:
        return Outcome(pods_out, p.placement_of(levels.domain[depth], prefix, pods_out))
    return Outcome(pods_out, p.placement_of(topo.slice_level, None, pods_out))


def _slices_in(
    p: PodSetPlacer, prefix: tuple[str, ...], sdepth: int, *, allow_new: bool
) -> _Choice | None:
    """The slices placed inside the domain ``prefix`` (``()``: the whole cluster)."""
    if sdepth == len(p.ws.index.levels.domain):
        return _node_slices_in(p, prefix, allow_new=allow_new)
    size = p.ps.topology.slice_size
    need = p.ps.count // size
    n = len(prefix)
    caps = {key: cap for key, cap in p.domain_caps(sdepth).items() if key[:n] == prefix}
    have = {key: cap // size for key, cap in caps.items()}
    room = sum(have.values())
    if room >= need:
        chosen = choose([(key, s, 1) for key, s in have.items()], need,
                        sort_key="/".join)
        return _Choice(tuple((key, s * size) for key, s, _ in chosen), (),
                       Purchase((), 0.0, 0), room)
    if not allow_new:
        return None
    by_key: dict[tuple[str, ...], list[Batch]] = {}
    for b in p.batches:
        if within(b.ref.path, sdepth) and b.ref.path[:n] == prefix:
            by_key.setdefault(b.ref.path[: sdepth + 1], []).append(b)
    slices = dict(have)
    bought: dict[tuple[str, ...], Purchase] = {}
    for _ in range(need - room):
        if not _buy_one_slice(p, by_key, caps, slices, bought):
            return None
    existing = tuple(
        (key, caps.get(key, 0) if key in bought else s * size)
        for key, s in sorted(slices.items()) if (caps.get(key, 0) if key in bought else s)
    )
    takes = tuple(t for key in sorted(bought) for t in bought[key].takes)
    return _Choice(existing, (), Purchase(takes, sum(b.cost for b in bought.values()),
                                          sum(b.nodes for b in bought.values())), room)


def _buy_one_slice(
    p: PodSetPlacer,
    by_key: dict[tuple[str, ...], list[Batch]],
    caps: dict[tuple[str, ...], int],
    slices: dict[tuple[str, ...], int],
    bought: dict[tuple[str, ...], Purchase],
) -> bool:
    """Add one slice in the slice domain where it costs least (then fewest nodes, then by
    name), updating ``slices`` and ``bought``; False when no domain can take one more."""
    size = p.ps.topology.slice_size
    pool_left = p.pool_left()
    pick: tuple[tuple[float, int, tuple[str, ...]], Purchase] | None = None
    for key in sorted(by_key):
        left = pool_left.copy()
        for other, pur in bought.items():
            if other != key:
                for b, nodes, _ in pur.takes:
                    left[b.ref.pool_index] = left[b.ref.pool_index] - nodes
        want = (slices.get(key, 0) + 1) * size - caps.get(key, 0)
        got = buy(by_key[key], want, left)
        if got is None:
            continue
        had = bought.get(key)
        rank = (got.cost - (had.cost if had else 0.0), got.nodes - (had.nodes if had else 0), key)
        if pick is None or rank < pick[0]:
            pick = (rank, got)
    if pick is None:
        return False
    key = pick[0][2]
    slices[key] = slices.get(key, 0) + 1
    bought[key] = pick[1]
    return True


def _node_slices_in(
    p: PodSetPlacer, prefix: tuple[str, ...], *, allow_new: bool
) -> _Choice | None:
    """Slices of one node each (the slice level is the hostname)."""
    size = p.ps.topology.slice_size
    need = p.ps.count // size
    n = len(prefix)
    units = [(cls, c // size) for cls, c in p.cands if c >= size and cls.path[:n] == prefix]
    room = sum(s * len(cls.members) for cls, s in units)
    if room >= need:
        chosen = choose([(cls, s, len(cls.members)) for cls, s in units], need,
                        sort_key=lambda cls: cls.first)
        return _Choice((), tuple((cls, s * size, k) for cls, s, k in chosen),
                       Purchase((), 0.0, 0), room)
    if not allow_new:
        return None
    scaled = [Batch(b.ref, b.per_node // size, b.nodes) for b in p.batches
              if b.per_node >= size and b.ref.path[:n] == prefix]
    pur = buy(scaled, need - room, p.pool_left())
    if pur is None:
        return None
    # Back to pods: a new node holds whole slices only (per_node rounded down to them).
    takes = tuple((Batch(b.ref, b.per_node * size, b.nodes), nodes, s * size)
                  for b, nodes, s in pur.takes)
    return _Choice((), tuple((cls, s * size, len(cls.members)) for cls, s in units),
                   Purchase(takes, pur.cost, pur.nodes), room)
