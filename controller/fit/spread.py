"""Placement of a pod set under DoNotSchedule topology spread constraints (the scheduler's
PodTopologySpread filter), on existing nodes and on the nodes the plan adds.

The scheduler admits a pod into a domain of the constraint's key while that domain's
matching pods, plus the pod, minus the fewest matching pods of any *eligible* domain stay
within ``maxSkew``. Eligible domains are those of every node carrying the key (and, by the
default policies, matching the pod's node affinity; taints only with nodeTaintsPolicy
Honor), usable or not, so a full node still counts as a domain. Muster creates a plan's new
nodes before the pods exist, so their domains are eligible from the first pod on: a new
node of another pod set in a third zone is a zone holding none of this pod set's pods.

Matching pods are the pod set's own (when the selector matches them), the running pods the
selector matches (:attr:`Spread.running`) and the pods of other pod sets of the gang it
matches (:attr:`Spread.peers`, counted as they were placed before this one; the gang checks
every constraint again once the whole gang is placed, :func:`spreads_hold`).

A final count per domain whose largest minus smallest is within ``maxSkew`` can be reached
pod by pod (the fewest first), so the engine plans such a count: for a level ``L`` (the
fewest pods any domain ends with; 0 with fewer domains than ``minDomains``) every domain
takes between ``L`` and ``L + maxSkew`` matching pods in all. Higher levels are tried first;
the cheapest level wins (existing room before new nodes). New domains a pool could add are
opened only when the domains there are cannot hold the pod set, cheapest first.

With the hostname key every node, existing or new, is a domain: new nodes take between ``L``
and ``L + maxSkew`` pods each (spread evenly). A hostname constraint next to another key's
(zone and hostname, the common pair) caps every node at ``maxSkew`` pods in all (``L`` 0,
valid whatever the rest holds) while the other key is planned as above.

The cheapest plan of a pod set alone may use fewer domains than the pools offer; another pod
set of the gang whose new nodes land in a further domain then breaks it (that domain holds
none of its pods). When the gang's check finds that, the gang places the same order again
*cautiously* (:attr:`PodSetPlacer.cautious`): every domain the pools offer opened (as many as
the pods allow), and on the hostname at most maxSkew pods a node (level 0), which no node
added later can break.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from controller.fit.placement import PodSetPlacer
from controller.fit.purchase import Batch, Outcome, PoolLeft, Purchase, Take, buy
from controller.fit.shapes import selector_matches, untolerated
from controller.fit.topology import HOSTNAME, NEW_HOSTNAME, fill
from controller.fit.types import Mode, PodSetPlacement, PodSetRequest, PodShape, Spread, Taint
from controller.fit.workspace import NodeClass, Workspace

EVERY_NODE = 1 << 20
"""A fill depth below every level: fewest nodes, domains ignored."""

MAX_LEVELS = 32
"""Per-node levels tried for a hostname spread, about (highest first, :func:`_node_levels`)."""

MAX_OPENED = 32
"""New domains tried one by one (a pool rarely offers more zones than this)."""


# ---------------------------------------------------------------------------- counting


def _domain(spread: Spread, name: str, labels: Mapping[str, str]) -> str | None:
    value = labels.get(spread.key)
    if value == NEW_HOSTNAME:
        return name  # a new node is its own hostname domain
    return value


def _eligible(
    spread: Spread, shape: PodShape, keys: Sequence[str], name: str | None,
    labels: Mapping[str, str], taints: tuple[Taint, ...],
) -> bool:
    """Whether the scheduler counts the node (and its pods) for ``spread``: it carries every
    constraint's key and passes the node inclusion policies (``shape``: the pod's own node
    selection, :func:`_own`)."""
    if any(k not in labels for k in keys):
        return False
    if spread.honor_affinity and not selector_matches(shape, labels, name):
        return False
    return not (spread.honor_taints and untolerated(taints, shape.tolerations))


def _own(shape: PodShape, spread: Spread) -> PodShape:
    """The shape with the pod's own node affinity, which nodeAffinityPolicy Honor reads."""
    if spread.affinity_terms is None:
        return shape
    return replace(shape, affinity_terms=spread.affinity_terms)


def domain_counts(
    ws: Workspace, ps: PodSetRequest, spread: Spread, *, own: bool,
    before: frozenset[str] | None = None,
) -> dict[str, int]:
    """Matching pods per eligible domain of ``spread`` now: running pods, the peers' pods
    placed so far (``before``: only those of these pod sets) and (``own``) the pod set's
    own."""
    shape = _own(ps.shape, spread)
    keys = [s.key for s in ps.shape.spreads]
    counts: dict[str, int] = {}
    on: dict[str, int] = dict(spread.running)
    peers = spread.peers if before is None else [n for n in spread.peers if n in before]
    sets = [*peers, *([ps.name] if own and spread.counts_self else [])]
    for pod_set in sets:
        for name, pods in ws.usage.placed.get(pod_set, ()):
            on[name] = on.get(name, 0) + pods
    for node in ws.all_nodes():
        if spread.key not in node.labels:
            continue
        if not _eligible(spread, shape, keys, node.name, node.labels, node.taints):
            continue
        value = node.labels[spread.key]
        counts[value] = counts.get(value, 0) + on.get(node.name, 0)
    for name, labels, taints in ws.slot_nodes():
        if not _eligible(spread, shape, keys, None, labels, taints):
            continue
        slot_value = _domain(spread, name, labels)
        if slot_value is not None:
            counts[slot_value] = counts.get(slot_value, 0) + on.get(name, 0)
    return counts


def _skew_ok(counts: Mapping[str, int], spread: Spread) -> bool:
    if not counts:
        return True
    low = 0 if len(counts) < spread.min_domains else min(counts.values())
    return max(counts.values()) - low <= spread.max_skew


def spreads_hold(ws: Workspace, pod_sets: Sequence[PodSetRequest]) -> str | None:
    """The first pod set whose spread the whole gang's plan breaks (pods of a pod set placed
    after it, or new nodes adding domains it holds none of), or None. ``pod_sets`` in the
    order their pods are created: the scheduler takes them in that order, so a pod set's
    spread must hold over its own pods and those of the pod sets before it."""
    for k, ps in enumerate(pod_sets):
        before = frozenset(p.name for p in pod_sets[:k])
        for spread in ps.shape.spreads:
            counts = domain_counts(ws, ps, spread, own=True, before=before)
            if spread.counts_self:
                if not _skew_ok(counts, spread):
                    return ps.name
                continue
            # Its pods match nothing: each went where the matching pods were within skew.
            low = 0 if len(counts) < spread.min_domains else min(counts.values(), default=0)
            used = {_domain(spread, n, ws.labels(n)) for n, k in ws.usage.placed.get(ps.name, ())
                    if k > 0}
            if any(counts.get(v, 0) - low > spread.max_skew for v in used if v is not None):
                return ps.name
    return None


def inherited(pod_sets: Sequence[PodSetRequest]) -> tuple[PodSetRequest, ...]:
    """Pod sets with the spreads of other pod sets that count their pods: the scheduler
    checks such a constraint only for the other pod set's pods, but those see where these
    went, so they are placed within it too (the final counts hold it either way). Only where
    the pod set has no spread on that key and keeps at most one key besides the hostname."""
    out: list[PodSetRequest] = []
    for ps in pod_sets:
        have = list(ps.shape.spreads)
        for other in pod_sets:
            if other is ps:
                continue
            for s in other.shape.spreads:
                if ps.name not in s.peers or not s.counts_self:
                    continue
                if any(h.key == s.key for h in have):
                    continue
                if s.key != HOSTNAME and any(h.key != HOSTNAME for h in have):
                    continue
                peers = tuple(n for n in (*s.peers, other.name) if n != ps.name)
                have.append(replace(s, peers=peers))
        if len(have) == len(ps.shape.spreads):
            out.append(ps)
            continue
        first = next((h for h in have if h.key != HOSTNAME), have[0])
        out.append(replace(ps, shape=replace(
            ps.shape, spread=first, more_spreads=tuple(h for h in have if h is not first))))
    return tuple(out)


# ---------------------------------------------------------------------------- placing


@dataclass(slots=True)
class _Domain:
    value: str
    count: int
    """Matching pods there already."""
    classes: list[NodeClass]
    existing: int
    """Pods of the pod set its existing nodes (and earlier new nodes) can take."""
    batches: list[Batch]
    new: int
    """Pods new nodes there could take (the pool-wide limits aside)."""
    opened: bool = False
    """Not a domain yet: only once the plan adds a node there."""

    @property
    def room(self) -> int:
        return self.existing + self.new


def spread_place(p: PodSetPlacer, spreads: Sequence[Spread]) -> Outcome | None:
    host = next((s for s in spreads if s.key == HOSTNAME), None)
    primary = next((s for s in spreads if s.key != HOSTNAME), host)
    assert primary is not None
    keys = [s.key for s in spreads]
    if primary is host:
        got = _by_node(p, primary, keys)
    elif host is None:
        got = _by_domain(p, primary, keys, None, None, None)
    else:
        got = _pair(p, primary, host, keys)
    if got is None:
        return None
    existing, purchase, even = got
    pods = p.commit(existing, purchase, even=even)
    return Outcome(pods, PodSetPlacement(p.ps.name, None, None, len(pods)))


def _pair(
    p: PodSetPlacer, spread: Spread, host: Spread, keys: Sequence[str]
) -> tuple[list[Take], Purchase, bool] | None:
    """A key's spread and the hostname's on one pod set. While no node is a hostname domain
    yet (only new nodes will be), every new node takes between L and L + maxSkew pods, spread
    evenly within its domain, for the highest such L that works; otherwise every node ends
    with at most maxSkew of the matching pods (L 0, whatever the others hold)."""
    held = domain_counts(p.ws, p.ps, host, own=False)
    counts = domain_counts(p.ws, p.ps, spread, own=False)
    if held or not host.counts_self or p.cautious:
        return _by_domain(p, spread, keys, held, host, None, counts)
    top = p.most_per_node(p.ps.count)
    for level in _node_levels(top, p.ps.count):
        if level == 0:
            break  # the plan below (every node at most maxSkew) is level 0's
        got = _by_domain(p, spread, keys, held, host, level, counts)
        if got is not None and got[1].nodes < host.min_domains:
            continue
        if got is not None and all(pods // nodes >= level for _, nodes, pods in got[1].takes):
            return got[0], got[1], True
    return _by_domain(p, spread, keys, held, host, None, counts)


def _class_cap(p: PodSetPlacer, cls: NodeClass, c: int, caps: dict[str, int] | None,
               host: Spread | None) -> int:
    if caps is None or host is None:
        return c
    if not host.counts_self:
        return c if all(caps.get(m, 0) <= host.max_skew for m in cls.members) else 0
    held = max((caps.get(m, 0) for m in cls.members), default=0)
    return max(0, min(c, host.max_skew - held))


def _by_domain(
    p: PodSetPlacer, spread: Spread, keys: Sequence[str], caps: dict[str, int] | None,
    host: Spread | None, level: int | None, counts: dict[str, int] | None = None,
) -> tuple[list[Take], Purchase, bool] | None:
    """``host``: a hostname spread beside ``spread``; every node takes at most its maxSkew
    (``caps``: matching pods each node holds already), or, with ``level``, new nodes take
    between ``level`` and ``level`` + maxSkew each. ``counts``: :func:`domain_counts` of
    ``spread``, when the caller has them."""
    if counts is None:
        counts = domain_counts(p.ws, p.ps, spread, own=False)
    per: dict[str, int] = {}
    domains: dict[str, _Domain] = {v: _Domain(v, c, [], 0, [], 0) for v, c in counts.items()}
    for cls, c in p.cands:
        if any(k not in cls.labels for k in keys):
            continue
        value = cls.labels[spread.key]
        c = _class_cap(p, cls, c, caps, host)
        if c <= 0:
            continue
        per[cls.first] = c
        d = domains.get(value)
        if d is None:  # a node the pod set can use that is no eligible domain (Ignore)
            d = domains[value] = _Domain(value, 0, [], 0, [], 0)
        d.classes.append(cls)
        d.existing += c * len(cls.members)
    pool_left = p.pool_left()
    if not p.cautious and level is None and any(d.existing for d in domains.values()):
        # The domains there holding the pod set on their existing room cost nothing: that
        # plan wins whatever new capacity could add, so the catalogue is not walked.
        got = _levels(p, spread, list(domains.values()), pool_left.copy(), per)
        if got is not None and got[1].nodes == 0:
            return (*got, False)
    node_cap = None if host is None else host.max_skew + (level or 0)
    fresh = _add_batches(p, spread, keys, node_cap, level or 0, domains, pool_left)
    opened = sorted(fresh.values(), key=lambda d: (_price(d), d.value))[:MAX_OPENED]
    got = _over_opened(p, spread, list(domains.values()), opened, pool_left, per)
    return None if got is None else (*got, False)


def _over_opened(
    p: PodSetPlacer, spread: Spread, base: list[_Domain], opened: list[_Domain],
    pool_left: PoolLeft, per: dict[str, int],
) -> tuple[list[Take], Purchase] | None:
    """The plan over the domains there (``base``) and new ones (``opened``, cheapest
    first)."""
    # An opened domain holds at least one pod of the set (it is a domain only once a node is
    # there), so more opened domains than pods cannot plan.
    most = min(len(opened), p.ps.count)
    if p.cautious:
        # Other pod sets of the gang may add nodes in any domain the pools offer: open them
        # all (as many as the pods allow), so none appears later holding none of the pods.
        for k in range(most, -1, -1):
            got = _levels(p, spread, [*base, *opened[:k]], pool_left.copy(), per)
            if got is not None:
                return got
        return None
    # The cheapest plan over the domains there and the first k new ones; at equal cost the
    # most domains (what the constraint asks for: the pods apart).
    best: tuple[tuple[float, int, int], tuple[list[Take], Purchase]] | None = None
    for k in range(most + 1):
        got = _levels(p, spread, [*base, *opened[:k]], pool_left.copy(), per)
        if got is not None:
            rank = (got[1].cost, got[1].nodes, -k)
            if best is None or rank < best[0]:
                best = (rank, got)
            if got[1].nodes == 0:
                break
    return None if best is None else best[1]


def _add_batches(
    p: PodSetPlacer, spread: Spread, keys: Sequence[str], node_cap: int | None, least: int,
    domains: dict[str, _Domain], pool_left: PoolLeft,
) -> dict[str, _Domain]:
    """New capacity per domain of the key (at most ``node_cap`` pods a node, nodes that
    hold fewer than ``least`` left out): into ``domains``, or domains not there yet
    (returned).

    Per domain, the pools are walked cheapest node first and the walk stops at a node
    priced above the cheapest single pool's way of holding the whole pod set there: no
    share of the pod set a domain takes is bought cheaper with such nodes, so the spread's
    cost does not grow with the pools that cannot serve it."""
    fresh: dict[str, _Domain] = {}
    if p.mode is not Mode.PROVISION:
        return fresh
    need = p.ps.count
    fits = p.pool_per_node()
    for value, refs in p.ws.index.catalogue.by_label(spread.key).items():
        bound = math.inf
        d = domains.get(value)
        for ref in refs:
            price = ref.pool.planning_price
            if price > bound:
                break
            if fits[ref.ordinal] <= 0 or any(k not in ref.labels for k in keys):
                continue
            b = p.batch_of(ref)
            if b is None:
                continue
            per_node = b.per_node if node_cap is None else min(b.per_node, node_cap)
            if per_node <= 0 or per_node < least:
                continue
            if d is None:
                d = fresh.get(value)
                if d is None:
                    d = fresh[value] = _Domain(value, 0, [], 0, [], 0, opened=True)
            nodes = min(b.nodes, pool_left[ref.pool_index])
            d.batches.append(b if per_node == b.per_node else Batch(ref, per_node, b.nodes))
            d.new += per_node * nodes
            if nodes * per_node >= need:
                bound = min(bound, -(-need // per_node) * price)
    return fresh


def _price(d: _Domain) -> float:
    return min((b.price / b.per_node for b in d.batches), default=0.0)


def _levels(
    p: PodSetPlacer, spread: Spread, domains: list[_Domain], pool_left: PoolLeft,
    per: dict[str, int],
) -> tuple[list[Take], Purchase] | None:
    """The cheapest plan over ``domains`` at any level (see the module docstring)."""
    need, skew = p.ps.count, spread.max_skew
    if not domains:
        return None
    if not spread.counts_self:
        return _beside(p, spread, domains, pool_left, per)
    few = len(domains) < spread.min_domains
    top = 0 if few else min(d.count + d.room for d in domains)
    top = min(top, (need + sum(d.count for d in domains)) // len(domains))
    best: tuple[tuple[float, int, int], list[Take], Purchase] | None = None
    tried: tuple[dict[str, int], dict[str, int] | None] | None = None
    for level in range(top, -1, -1):
        lo = {d.value: max(0, level - d.count, 1 if d.opened else 0) for d in domains}
        hi = {d.value: min(d.room, level + skew - d.count) for d in domains}
        if any(hi[v] < lo[v] for v in lo):
            if any(d.count > level + skew for d in domains):
                break  # a domain already over: lower levels only make it worse
            continue
        bounds = _bounds(lo, hi, need)
        if bounds is None or bounds == tried:
            continue  # no plan, or the level above's plan (ranked above this one)
        tried = bounds
        got = _realise(p, domains, lo, hi, need, pool_left.copy(), per)
        if got is None:
            continue
        takes, purchase = got
        rank = (purchase.cost, purchase.nodes, -level)
        if best is None or rank < best[0]:
            best = (rank, takes, purchase)
        if purchase.nodes == 0:
            break
    if best is None:
        return None
    for batch, nodes, _ in best[2].takes:
        pool_left[batch.ref.pool_index] = pool_left[batch.ref.pool_index] - nodes
    return best[1], best[2]


def _bounds(
    lo: dict[str, int], hi: dict[str, int], need: int
) -> tuple[dict[str, int], dict[str, int] | None] | None:
    """What decides :func:`_realise`'s plan at bounds ``lo``..``hi``: None when they cannot
    hold ``need`` pods; the upper bounds only while the lower ones leave pods to place."""
    low = sum(lo.values())
    if low > need or sum(hi.values()) < need:
        return None
    return lo, hi if low < need else None


def _realise(
    p: PodSetPlacer, domains: list[_Domain], lo: dict[str, int], hi: dict[str, int],
    need: int, pool_left: PoolLeft, per: dict[str, int],
) -> tuple[list[Take], Purchase] | None:
    """Pods per domain within [lo, hi]: the extra pods to existing room first (roomiest
    domains first), then to the cheapest new capacity; then which nodes."""
    x = dict(lo)
    extra = need - sum(lo.values())
    for d in sorted(domains, key=lambda d: (-(d.existing - x[d.value]), d.value)):
        if extra <= 0:
            break
        more = max(0, min(hi[d.value], d.existing) - x[d.value])
        more = min(more, extra)
        x[d.value] += more
        extra -= more
    for d in sorted(domains, key=lambda d: (_price(d), d.value)):
        if extra <= 0:
            break
        more = min(hi[d.value] - x[d.value], extra)
        x[d.value] += more
        extra -= more
    if extra > 0:
        return None
    takes: list[Take] = []
    parts: list[tuple[Batch, int, int]] = []
    cost, nodes = 0.0, 0
    for d in domains:
        n = x[d.value]
        if n <= 0:
            continue
        on_existing = min(n, d.existing)
        if on_existing:
            takes.extend(_fill(d.classes, on_existing, per))
        rest = n - on_existing
        if rest:
            got = buy(d.batches, rest, pool_left)
            if got is None:
                return None
            parts.extend(got.takes)
            cost += got.cost
            nodes += got.nodes
    return takes, Purchase(tuple(parts), cost, nodes)


def _beside(
    p: PodSetPlacer, spread: Spread, domains: list[_Domain], pool_left: PoolLeft,
    per: dict[str, int],
) -> tuple[list[Take], Purchase] | None:
    """A selector that matches other pods only: the pod set's pods go to domains whose
    matching pods are within maxSkew of the fewest (they change no count)."""
    if any(d.opened for d in domains):
        return None  # a new domain would lower the fewest: not tried
    low = 0 if len(domains) < spread.min_domains else min(d.count for d in domains)
    allowed = [d for d in domains if d.count - low <= spread.max_skew]
    lo = {d.value: 0 for d in allowed}
    hi = {d.value: d.room for d in allowed}
    if sum(hi.values()) < p.ps.count:
        return None
    return _realise(p, allowed, lo, hi, p.ps.count, pool_left, per)


def _fill(classes: Sequence[NodeClass], need: int, per: dict[str, int]) -> list[Take]:
    return fill(
        classes, need, EVERY_NODE, path=lambda x: x.path, per_node=lambda x: per[x.first],
        nodes=lambda x: len(x.members), name=lambda x: x.first,
    )


# ---------------------------------------------------------------------------- hostname


def _by_node(
    p: PodSetPlacer, spread: Spread, keys: Sequence[str]
) -> tuple[list[Take], Purchase, bool] | None:
    """Every node a domain: eligible nodes each end with [L, L + maxSkew] matching pods."""
    need, skew = p.ps.count, spread.max_skew
    counts = domain_counts(p.ws, p.ps, spread, own=False)
    # Node name -> hostname value: counts are keyed by the label's value.
    usable: list[tuple[NodeClass, int]] = []
    for cls, c in p.cands:
        if any(k not in cls.labels for k in keys):
            continue
        usable.append((cls, c))
    held = {m: counts.get(_host(p.ws, m, spread), 0) for cls, _ in usable for m in cls.members}
    if not spread.counts_self:
        # Its pods change no count: nodes within maxSkew of the fewest (0 once a new node
        # joins, so taken as 0) take what fits.
        ok = [(cls, c) for cls, c in usable if all(held[m] <= skew for m in cls.members)]
        return _host_plan(p, ok, need, 0, 1 << 30, {}, counts_self=False)
    top = _host_top(p, spread, usable, held, counts)
    best: tuple[tuple[float, int, int], tuple[list[Take], Purchase]] | None = None
    for level in _node_levels(top, need):
        got = _host_plan(p, usable, need, level, level + skew, held, counts_self=True)
        if got is None:
            continue
        if level and len(counts) + got[1].nodes < spread.min_domains:
            continue  # fewer nodes than minDomains: the fewest counts as 0
        rank = (got[1].cost, got[1].nodes, -level)
        if best is None or rank < best[0]:
            best = (rank, (got[0], got[1]))
        if got[1].nodes == 0:
            break
    if best is None:
        return None
    return best[1][0], best[1][1], True


def _node_levels(top: int, need: int) -> list[int]:
    """Per-node levels worth trying, highest first, about ``MAX_LEVELS`` of them: those just
    under ``top``; for each count of nodes ``n`` the level ``need // n`` (n nodes of at
    least that many pods each hold ``need`` only at such a level, so a cap on the levels
    just under ``top`` alone missed every plan of a large pod set); and 0, always valid
    (every node at most maxSkew, whatever the others hold)."""
    levels = set(range(top, max(0, top - MAX_LEVELS // 2), -1))
    n = -(-need // top) if top > 0 else need + 1
    while len(levels) < MAX_LEVELS and n <= need:
        level = need // n
        levels.add(level)
        n = need // level + 1  # the next count of nodes with another level
    levels.add(0)
    return sorted(levels, reverse=True)


def _host_top(
    p: PodSetPlacer, spread: Spread, usable: list[tuple[NodeClass, int]],
    held: Mapping[str, int], counts: Mapping[str, int],
) -> int:
    """The highest level worth trying: every eligible node must reach it."""
    if any(held.values()) or any(counts.values()) or p.cautious:
        # Matching pods already on some nodes, or other pod sets' new nodes to come (each a
        # domain holding none of these pods): each node ends with at most maxSkew.
        return 0
    if not counts:  # only new nodes will be domains
        return p.most_per_node(p.ps.count)
    room: dict[str, int] = {}
    for cls, c in usable:
        for m in cls.members:
            room[_host(p.ws, m, spread)] = c
    return min(min(room.get(v, 0) for v in counts), p.ps.count // len(counts))


def _host(ws: Workspace, name: str, spread: Spread) -> str:
    value = _domain(spread, name, ws.labels(name))
    return value if value is not None else name


def _host_plan(
    p: PodSetPlacer, usable: list[tuple[NodeClass, int]], need: int, level: int, top: int,
    held: Mapping[str, int], *, counts_self: bool,
) -> tuple[list[Take], Purchase, bool] | None:
    """Every usable node gets between ``level`` and ``top`` pods in all (``held`` already
    there); new nodes too. With ``level`` > 0 every eligible node must reach it, which only
    nodes with room and nothing held do (the caller tries such levels only then)."""
    takes: list[Take] = []
    rest = need
    groups: list[tuple[NodeClass, int, int]] = []  # class, min pods each, max pods each
    for cls, c in usable:
        h = max((held.get(m, 0) for m in cls.members), default=0)
        hi = min(c, top - h) if counts_self else c
        if hi <= 0:
            continue
        groups.append((cls, min(level, hi), hi))
    floor = sum(lo * len(cls.members) for cls, lo, _ in groups)
    if floor > need:
        return None
    for cls, lo, _ in groups:
        if lo:
            takes.append((cls, lo, len(cls.members)))
            rest -= lo * len(cls.members)
    extra, rest = _extra(groups, rest)
    takes = _merge(takes, extra)
    if rest <= 0:
        return takes, Purchase((), 0.0, 0), True
    cap = top if counts_self else 1 << 30
    batches = _cheapest(p, rest, cap, max(level, 1))
    if not batches:
        return None
    purchase = buy(batches, rest, p.pool_left())
    if purchase is None:
        return None
    if any(pods // nodes < level for _, nodes, pods in purchase.takes):
        return None
    return takes, purchase, True


def _cheapest(p: PodSetPlacer, need: int, cap: int, least: int) -> list[Batch]:
    """The batches (at most ``cap`` pods a node, none holding fewer than ``least``) the
    cheapest purchase of ``need`` pods can use: the catalogue walked cheapest node first,
    up to a node priced above the cheapest single batch's way of holding them all.

    A batch no cheaper than one that holds all ``need`` pods alone and holding no more pods
    a node is skipped: any purchase using it costs no less with the other's nodes instead.
    Once such a batch holds ``cap`` pods a node every later one is, so the walk stops: a
    spread's per-node cap makes this short however many pools there are."""
    out: list[Batch] = []
    if p.mode is not Mode.PROVISION:
        return out
    bound = math.inf
    covered = 0
    pool_left = p.pool_left()
    fits = p.pool_per_node()
    for ref in p.ws.index.catalogue.by_price:
        fit = fits[ref.ordinal]
        if fit < least or min(fit, cap) <= covered:
            continue
        price = ref.pool.planning_price
        if price > bound:
            break
        b = p.batch_of(ref)
        if b is None:
            continue
        per_node = min(b.per_node, cap)
        if per_node < least:
            continue
        out.append(b if per_node == b.per_node else Batch(ref, per_node, b.nodes))
        if min(b.nodes, pool_left[ref.pool_index]) * per_node >= need:
            bound = min(bound, -(-need // per_node) * price)
            covered = max(covered, per_node)
            if covered >= cap:
                break
    return out


def _extra(groups: list[tuple[NodeClass, int, int]], rest: int) -> tuple[list[Take], int]:
    """``rest`` pods on top of each node's minimum, onto the nodes with the most room left
    (fewest nodes touched); what does not fit is returned."""
    extra: list[Take] = []
    for cls, lo, hi in sorted(groups, key=lambda g: (-(g[2] - g[1]), g[0].first)):
        if rest <= 0:
            break
        room = hi - lo
        if room <= 0:
            continue
        whole = min(len(cls.members), rest // room)
        if whole:
            extra.append((cls, room, whole))
            rest -= whole * room
        if rest and whole < len(cls.members) and rest < room:
            extra.append((cls, rest, 1))
            rest = 0
    return extra, rest


def _merge(base: list[Take], extra: list[Take]) -> list[Take]:
    """Takes of one class as per-node counts: ``base`` gives every member ``lo`` pods, and
    ``extra`` adds pods to its first members."""
    if not extra:
        return base
    out: list[Take] = []
    more: dict[object, list[tuple[int, int]]] = {}
    for cls, pods, nodes in extra:
        more.setdefault(cls.key, []).append((pods, nodes))
    lo_of = {cls.key: (cls, pods) for cls, pods, _ in base}
    for key, (cls, lo) in lo_of.items():
        done = 0
        for pods, nodes in more.pop(key, []):
            out.append((cls, lo + pods, nodes))
            done += nodes
        if len(cls.members) - done:
            out.append((cls, lo, len(cls.members) - done))
    for cls, pods, nodes in extra:
        if cls.key in more:
            out.append((cls, pods, nodes))
    return out
