"""Placement of a pod set under a DoNotSchedule topology spread constraint among its own
pods (the scheduler's PodTopologySpread filter).

The scheduler admits a pod into a domain of the constraint's key while that domain's
matching pods, plus the pod, minus the fewest matching pods of any *eligible* domain stay
within ``maxSkew``. Eligible domains are those of every node carrying the key (and, by the
default policies, matching the pod's node affinity; taints only with nodeTaintsPolicy
Honor), usable or not, so a full node still counts as a domain holding none of the pods.
A final count per domain whose largest minus smallest is within ``maxSkew`` can be reached
pod by pod, so the engine plans such a count:

* existing nodes only: every eligible domain gets at least ``lo`` and at most
  ``lo + maxSkew`` pods, for the largest ``lo`` that works (``lo`` is 0 when there are fewer
  eligible domains than ``minDomains``);
* with new nodes: ``lo`` is 0, so no domain (no node, when the key is the hostname) takes
  more than ``maxSkew`` pods. Valid whatever the other domains hold; it may buy more nodes
  than a larger ``lo`` would (conservative, never wrong).

Nodes without the key cannot take these pods at all.
"""

from __future__ import annotations

from dataclasses import replace

from controller.fit.placement import Batch, Outcome, PodSetPlacer, Purchase, Take, buy
from controller.fit.shapes import selector_matches, untolerated
from controller.fit.topology import HOSTNAME
from controller.fit.types import PodSetPlacement, Spread
from controller.fit.workspace import NodeClass

EVERY_NODE = 1 << 20
"""A fill depth below every level: fewest nodes, domains ignored."""


def _eligible(p: PodSetPlacer, spread: Spread) -> set[str]:
    shape = p.ps.shape
    if spread.affinity_terms is not None:
        shape = replace(shape, affinity_terms=spread.affinity_terms)
    out: set[str] = set()
    for n in p.ws.all_nodes():
        value = n.labels.get(spread.key)
        if value is None or value in out:
            continue
        if spread.honor_affinity and not selector_matches(shape, n.labels, n.name):
            continue
        if spread.honor_taints and untolerated(n.taints, shape.tolerations):
            continue
        out.add(value)
    return out


def spread_place(p: PodSetPlacer, spread: Spread) -> Outcome | None:
    key = spread.key
    classes: dict[str, list[NodeClass]] = {}
    cap: dict[str, int] = {}
    for cls, c in p.cands:
        value = cls.labels.get(key)
        if value is not None:
            classes.setdefault(value, []).append(cls)
            cap[value] = cap.get(value, 0) + c * len(cls.members)
    eligible = sorted(_eligible(p, spread) | set(cap))
    got: tuple[list[Take], Purchase | None] | None = _existing(
        p, spread, eligible, classes, cap
    )
    if got is None and p.batches:
        got = _with_new(p, spread, eligible, classes, cap)
    if got is None:
        return None
    existing, purchase = got
    pods = p._commit(existing, purchase)
    return Outcome(pods, PodSetPlacement(p.ps.name, None, None, len(pods)))


def _existing(
    p: PodSetPlacer, spread: Spread, eligible: list[str], classes: dict[str, list[NodeClass]],
    cap: dict[str, int],
) -> tuple[list[Take], None] | None:
    need, skew = p.ps.count, spread.max_skew
    if not eligible:
        return None
    caps = [cap.get(v, 0) for v in eligible]
    top = 0 if len(eligible) < spread.min_domains else min(min(caps), need // len(eligible))
    for lo in range(top, -1, -1):
        if sum(min(c, lo + skew) for c in caps) < need:
            continue
        counts = {v: lo for v in eligible}
        rest = need - lo * len(eligible)
        # The extra pods go to the roomiest domains first (fewest domains), then by name.
        for v in sorted(eligible, key=lambda d: (-cap.get(d, 0), d)):
            if rest <= 0:
                break
            more = min(rest, min(cap.get(v, 0), lo + skew) - lo)
            counts[v] += more
            rest -= more
        takes: list[Take] = []
        for v, n in counts.items():
            if n > 0:
                takes.extend(p._fill(classes[v], n, EVERY_NODE))
        return takes, None
    return None


def _with_new(
    p: PodSetPlacer, spread: Spread, eligible: list[str], classes: dict[str, list[NodeClass]],
    cap: dict[str, int],
) -> tuple[list[Take], Purchase] | None:
    need, skew, key = p.ps.count, spread.max_skew, spread.key
    per_node = key == HOSTNAME
    takes: list[Take] = []
    taken = 0
    for v in eligible:
        if v not in classes:
            continue
        room = min(cap[v], skew) if not per_node else cap[v]
        n = min(room, need - taken)
        if n <= 0:
            continue
        if per_node:  # one node per domain: at most maxSkew pods on it
            cls = classes[v][0]
            n = min(n, skew, p.per_node[cls.key])
            takes.append((cls, n, 1))
        else:
            takes.extend(p._fill(classes[v], n, EVERY_NODE))
        taken += n
    rest = need - taken
    if rest <= 0:
        return takes, Purchase((), 0.0, 0)
    pool_left = p.pool_left()
    if per_node:
        batches = p.cheapest(rest, cap=skew)
        purchase = buy(batches, rest, pool_left)
        return None if purchase is None else (takes, purchase)
    purchase = _per_domain(p, spread, takes, rest, pool_left)
    return None if purchase is None else (takes, purchase)


def _per_domain(
    p: PodSetPlacer, spread: Spread, takes: list[Take], rest: int, pool_left: dict[int, int]
) -> Purchase | None:
    """New nodes for ``rest`` pods, no domain of the key holding more than maxSkew of them
    (``takes`` already put some on existing nodes)."""
    key, skew = spread.key, spread.max_skew
    by_value: dict[str, list[Batch]] = {}
    for b in p.batches:
        value = b.ref.labels.get(key)
        if value is not None:
            by_value.setdefault(value, []).append(b)
    held: dict[str, int] = {}
    for cls, n, k in takes:
        value = cls.labels[key]
        held[value] = held.get(value, 0) + n * k
    parts: list[tuple[Batch, int, int]] = []
    cost, nodes = 0.0, 0
    for v in sorted(by_value, key=lambda d: (min(b.price / b.per_node for b in by_value[d]), d)):
        want = min(rest, skew - held.get(v, 0))
        if want <= 0:
            continue
        got = buy(by_value[v], want, pool_left)
        if got is None:
            continue
        parts.extend(got.takes)
        cost += got.cost
        nodes += got.nodes
        rest -= want
        if rest == 0:
            return Purchase(tuple(parts), cost, nodes)
    return None
