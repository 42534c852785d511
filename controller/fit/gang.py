"""The gang: every pod set placed, or none. Entry point :func:`plan`.

Pod sets are placed one after another on a forked :class:`Workspace` (usage accumulates,
so pod sets compete for nodes and pool headroom like real pods would). If one does not fit
the fork is dropped and, for gangs of a few pod sets, other orders are tried: placing the
pod set with the narrowest choice first often makes a gang fit that the given order does
not. The search is bounded (:data:`MAX_PLACEMENTS`), so for gangs of several competing pod sets
the engine is a heuristic; for a single pod set it is exact.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import chain, islice, permutations

from controller.fit import packing
from controller.fit.cel import SelectorError
from controller.fit.explain import explain, validate
from controller.fit.purchase import Outcome
from controller.fit.spread import inherited, spreads_hold
from controller.fit.strategies import place
from controller.fit.topology import NEW_HOSTNAME, Levels
from controller.fit.types import (
    Assignment,
    GangRequest,
    Mode,
    NewNodes,
    NoFit,
    Plan,
    PodSetRequest,
    PodShape,
    Reason,
    ReasonCode,
    Result,
    Snapshot,
    TopologyMode,
    usable_for,
)
from controller.fit.workspace import Workspace

MAX_PLACEMENTS = 96
"""Budget of pod-set placements per gang attempt: all orders of up to four pod sets, at
least two orders (given, narrowest first) for larger gangs."""


def _budget(pod_sets: int) -> int:
    return max(2, MAX_PLACEMENTS // max(1, pod_sets))


def _orders(pod_sets: Sequence[PodSetRequest]) -> Iterator[tuple[PodSetRequest, ...]]:
    """The given order, then narrowest choice first, then the other permutations (lazily)."""
    given = tuple(pod_sets)
    yield given
    if len(given) < 2:
        return
    seen = {tuple(p.name for p in given)}

    def narrow_first(p: PodSetRequest) -> tuple[int, int, int, str]:
        constrained = 0 if p.topology.mode is TopologyMode.REQUIRED else 1
        # Spread pod sets last: the domains other pod sets' new nodes add are known then.
        return (1 if p.shape.spreads else 0, constrained,
                -p.count * max(p.shape.requests.values(), default=0), p.name)

    for order in chain((tuple(sorted(given, key=narrow_first)),), permutations(given)):
        names = tuple(p.name for p in order)
        if names not in seen:
            seen.add(names)
            yield order


@dataclass(frozen=True, slots=True)
class _Failure:
    """Where the first tried order stopped: the workspace before ``pod_set``, and the pod
    sets already placed on it (their usage is part of why ``pod_set`` did not fit)."""

    ws: Workspace
    pod_set: PodSetRequest
    placed: tuple[str, ...]

    def explain(self, snapshot: Snapshot, mode: Mode) -> Reason:
        reason = explain(self.pod_set, self.ws, snapshot, mode)
        if not self.placed:
            return reason
        return replace(reason, message=f"{reason.message} (after placing pod set"
                       f"{'s' if len(self.placed) > 1 else ''} {', '.join(self.placed)})")


def _attempt(
    request: GangRequest, base: Workspace, mode: Mode
) -> tuple[Workspace, dict[str, Outcome]] | _Failure:
    """Place the gang on forks of ``base``; on failure return the first failure's state."""
    first_failure: _Failure | None = None
    spread_sets = len(request.pod_sets) > 1 and any(p.shape.spreads for p in request.pod_sets)
    if spread_sets:
        request = replace(request, pod_sets=inherited(request.pod_sets))
    for order in islice(_orders(request.pod_sets), _budget(len(request.pod_sets))):
        for cautious in (False, True):
            ws = base.fork()
            outcomes: dict[str, Outcome] = {}
            for ps in order:
                got = place(ws, ps, mode, cautious=cautious)
                if got is None:
                    # A placement changes the workspace only on success: ``ws`` is the
                    # state before ``ps``, and nothing places on it after this.
                    if first_failure is None:
                        first_failure = _Failure(ws, ps, tuple(outcomes))
                    break
                outcomes[ps.name] = got
            else:
                broken = spreads_hold(ws, request.pod_sets) if spread_sets else None
                if broken is None:
                    return ws, outcomes
                # Pod sets placed after it (or their new nodes) broke its spread: the same
                # order with spreads that later nodes cannot break, then another order.
                if first_failure is None:
                    ps = next(p for p in order if p.name == broken)
                    first_failure = _Failure(base.fork(), ps, ())
                continue
            break  # a pod set did not fit: placing it cautiously does not make it fit
    assert first_failure is not None
    return first_failure


def _packed(
    request: GangRequest, base: Workspace, mode: Mode, got: tuple[Workspace, dict[str, Outcome]]
) -> tuple[Workspace, dict[str, Outcome]]:
    """``got``, or the gang placed again with the new nodes of its free pod sets bought
    together when that costs less (:mod:`controller.fit.packing`): first with its spread pod
    sets among them, then, if that plan is not cheaper, without them."""
    ws, outcomes = got
    if mode is not Mode.PROVISION or not ws.usage.domain_used or len(request.pod_sets) < 2:
        return got
    budget = packing.cost(ws)
    tried: list[list[tuple[PodShape, int]]] = []
    for spreads in (True, False):
        demand = []
        for ps in request.pod_sets:
            if packing.packable(ps, base.index.levels, spreads=spreads):
                n = packing.new_pods(ws, outcomes[ps.name].pods)
                if n > 0:
                    demand.append((ps.shape, n))
        if len(demand) < 2 or demand in tried:
            continue
        tried.append(demand)
        again = _packed_with(request, base, mode, demand, budget)
        if again is not None:
            return again
    return got


def _packed_with(
    request: GangRequest, base: Workspace, mode: Mode, demand: list[tuple[PodShape, int]],
    budget: float,
) -> tuple[Workspace, dict[str, Outcome]] | None:
    """The gang placed on the nodes :func:`packing.choose` buys for ``demand``, if it costs
    less than ``budget`` and every node bought up front holds pods."""
    choice = packing.choose(base, demand, budget)
    if choice is None:
        return None
    trial = base.fork()
    bought: set[str] = set()
    for ref, k in choice:
        bought.update(trial.add_nodes(ref, [0] * k, {}))
    again = _attempt(replace(request, pod_sets=packing.first(request.pod_sets)), trial, mode)
    if isinstance(again, _Failure) or packing.cost(again[0]) >= budget:
        return None
    used = {name for o in again[1].values() for name, n in o.pods if n > 0}
    return again if bought <= used else None


def _build(
    request: GangRequest, ws: Workspace, outcomes: dict[str, Outcome], mode: Mode
) -> Result:
    assignments: list[Assignment] = []
    levels = ws.index.levels.all
    for ps in request.pod_sets:
        got = outcomes[ps.name]
        merged: dict[str, int] = {}
        for name, pods in got.pods:
            if pods > 0:
                merged[name] = merged.get(name, 0) + pods
        requests = dict(ps.shape.requests)
        for name in sorted(merged):
            slot = ws.usage.slots.get(name)
            labels = ws.labels(name)
            assignments.append(
                Assignment(
                    pod_set=ps.name,
                    pods=merged[name],
                    node=None if slot else name,
                    new_node=slot,
                    domain={k: labels[k] for k in levels
                            if k in labels and labels[k] != NEW_HOSTNAME},
                    requests=requests,
                    devices=tuple(ws.usage.allocations.get((name, ps.name), ())),
                )
            )
    # One entry per (pool, domain labels), merging a pool's domains that share labels.
    counts: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, float]] = {}
    for (pi, di), count in ws.usage.domain_used.items():
        pool = ws.index.pools[pi]
        key = (pool.name, tuple(sorted(pool.domains[di].labels.items())))
        have, _ = counts.get(key, (0, 0.0))
        counts[key] = (have + count, pool.price_per_node_hour)
    new_nodes = [
        NewNodes(name, dict(labels), count, count * price)
        for (name, labels), (count, price) in sorted(counts.items())
        if count > 0
    ]
    return Plan(
        request=request.name,
        mode=mode,
        assignments=tuple(assignments),
        new_nodes=tuple(new_nodes),
        placements=tuple(outcomes[ps.name].placement for ps in request.pod_sets),
        cost_per_hour=sum(n.cost_per_hour for n in new_nodes),
    )


def plan(request: GangRequest, snapshot: Snapshot, mode: Mode) -> Result:
    """Where the whole gang fits (a :class:`Plan`) or why it does not (a :class:`NoFit`).

    Check mode uses existing nodes only; provision mode adds nodes from the snapshot's pools,
    existing capacity first, then the cheapest new capacity. Deterministic.
    """
    invalid = validate(request, snapshot)
    if invalid:
        return NoFit(request.name, mode, tuple(invalid))
    try:
        return _plan(request, snapshot, mode)
    except SelectorError as exc:
        # A CEL selector that fails on a device fails the claim, as in the scheduler.
        return NoFit(request.name, mode, (Reason(ReasonCode.INVALID, None, str(exc)),))


def _without_repeats(reason: Reason, earlier: str) -> Reason | None:
    """``reason`` without the clauses ``earlier`` already said (the NeverFits reason before
    it usually states the same need), None when it adds nothing."""
    said = set(earlier.split("; "))
    clauses = reason.message.split("; ")
    kept = [c for c in clauses if c not in said]
    if not kept:
        return None
    if len(kept) == len(clauses):
        return reason
    return replace(reason, message="now " + "; ".join(kept))


def plan_on(
    request: GangRequest, base: Workspace, mode: Mode
) -> tuple[Plan, Workspace] | None:
    """The gang's plan on ``base`` (left unchanged) and the workspace carrying its usage, or
    None when it does not fit there (:func:`plan` then says why). ``request`` must be valid
    (:func:`controller.fit.explain.validate`) and claim no devices."""
    got = _attempt(request, base, mode)
    if isinstance(got, _Failure):
        return None
    got = _packed(request, base, mode, got)
    result = _build(request, got[0], got[1], mode)
    assert isinstance(result, Plan)
    return result, got[0]


def _plan(request: GangRequest, snapshot: Snapshot, mode: Mode) -> Result:
    levels = Levels.of(snapshot.levels)
    pools = usable_for(snapshot.pools, request.run_seconds) if mode is Mode.PROVISION else ()
    shapes = [ps.shape for ps in request.pod_sets]
    base = Workspace(snapshot.nodes, pools, levels, shapes)
    got = _attempt(request, base, mode)
    if not isinstance(got, _Failure):
        got = _packed(request, base, mode, got)
        return _build(request, got[0], got[1], mode)
    reasons: list[Reason] = [got.explain(snapshot, mode)]
    # The best the cluster could ever offer: nothing running, every node usable, every pool
    # at its maximum. If even that cannot hold the gang, waiting will not help.
    best = _attempt(
        request,
        Workspace(snapshot.nodes, snapshot.pools, levels, shapes, empty=True),
        Mode.PROVISION,
    )
    if isinstance(best, _Failure):
        why = best.explain(snapshot, Mode.PROVISION)
        now = _without_repeats(reasons[0], why.message)
        reasons = [now] if now is not None else []
        counted = _counting_each_other(request)
        if counted and not isinstance(_attempt(_relaxed(request), Workspace(
            snapshot.nodes, snapshot.pools, levels, shapes, empty=True), Mode.PROVISION
        ), _Failure):
            # Pod sets whose spreads count each other's pods are placed one after another
            # in a few orders (a heuristic): finding none is no proof that none exists.
            reasons.insert(0, Reason(
                ReasonCode.UNSUPPORTED, best.pod_set.name,
                f"gang {request.name}: the topology spread of pod set {counted} counts the "
                "pods of other pod sets of the gang, and Muster found no placement in the "
                f"orders it tries ({why.message})",
                needed=why.needed, best=why.best, level=why.level, domain=why.domain,
            ))
            return NoFit(request.name, mode, tuple(reasons))
        reasons.insert(
            0,
            Reason(
                ReasonCode.NEVER_FITS,
                best.pod_set.name,
                f"gang {request.name} can never fit, even with every node empty and usable and "
                f"every pool at its maximum: {why.message}",
                needed=why.needed,
                best=why.best,
                level=why.level,
                domain=why.domain,
            ),
        )
    return NoFit(request.name, mode, tuple(reasons))


def _relaxed(request: GangRequest) -> GangRequest:
    """The gang without the spreads that count other pod sets' pods (fewer constraints: if
    even this never fits, the gang never fits)."""
    sets = []
    for ps in request.pod_sets:
        kept = [s for s in ps.shape.spreads if not s.peers]
        sets.append(replace(ps, shape=replace(
            ps.shape, spread=kept[0] if kept else None, more_spreads=tuple(kept[1:]))))
    return replace(request, pod_sets=tuple(sets))


def _counting_each_other(request: GangRequest) -> str | None:
    """The first pod set with a spread that counts another pod set's pods, if any."""
    for ps in request.pod_sets:
        if any(s.peers for s in ps.shape.spreads):
            return ps.name
    return None
