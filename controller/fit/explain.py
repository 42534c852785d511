"""NoFit reasons: which constraint failed and by how much, in words an operator can act on.

Built after a pod set failed to place, from the same workspace placement saw, e.g.
"pod set workers needs 16 pods x 8 nvidia.com/gpu within one value of rack; the best rack
(b1/r3) has room for 11; pool p5 can add 2 more nodes there (its domain limit is 8)".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.fit.devices import ClaimFitter, describe_claim, emptied
from controller.fit.dra_types import NodeDevices
from controller.fit.placement import PodSetPlacer
from controller.fit.ports import describe, is_port
from controller.fit.purchase import Batch
from controller.fit.shapes import (
    pods_that_fit,
    requirement_matches,
    resource_fit,
    selector_matches,
    untolerated,
)
from controller.fit.slices import applies
from controller.fit.topology import ABSENT, within
from controller.fit.types import (
    GangRequest,
    Mode,
    NodeState,
    NoFit,
    PodSetRequest,
    PodShape,
    Reason,
    ReasonCode,
    SelectorRequirement,
    Snapshot,
    TopologyMode,
)
from controller.fit.workspace import Workspace

_BASIC = ("cpu", "memory", "pods", "ephemeral-storage")


def format_amount(resource: str, amount: int) -> str:
    if resource == "cpu":
        return f"{amount // 1000} cpu" if amount % 1000 == 0 else f"{amount}m cpu"
    if resource in ("memory", "ephemeral-storage"):
        for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if amount >= size and amount % size == 0:
                return f"{amount // size}{unit} {resource}"
        return f"{amount} {resource}"
    return f"{amount} {resource}"


def describe_shape(requests: Mapping[str, int]) -> str:
    """The request that usually decides placement: an accelerator, else cpu, else memory."""
    special = sorted(r for r, v in requests.items()
                     if v > 0 and r not in _BASIC and not is_port(r))
    for res in (*special, "cpu", "memory"):
        amount = requests.get(res, 0)
        if amount > 0:
            return format_amount(res, amount)
    return "no resources"


def _needs(ps: PodSetRequest) -> str:
    pods = "pod" if ps.count == 1 else "pods"
    devices = "".join(f" + {describe_claim(c)}" for c in ps.shape.claims)
    devices += "".join(f" + {describe(r)}" for r in sorted(ps.shape.requests)
                       if is_port(r) and r.count("/") == 2)
    spread = ps.shape.spread
    how = (f" spread over {spread.key.rsplit('/', 1)[-1]} (maxSkew {spread.max_skew})"
           if spread is not None else "")
    return (f"pod set {ps.name} needs {ps.count} {pods} x "
            f"{describe_shape(ps.shape.requests)}{devices}{how}")


def _slices(ps: PodSetRequest) -> str:
    topo = ps.topology
    if topo.slice_level is None or topo.slice_size < 1:
        return ""
    return f" in slices of {topo.slice_size} pods, each within one {_short(topo.slice_level)}"


def _short(level: str) -> str:
    return level.rsplit("/", 1)[-1]


def _device_failure(
    fitter: ClaimFitter | None, devices: NodeDevices | None
) -> str | None:
    """Why not even one pod's claims can be allocated on ``devices`` when all are free."""
    if fitter is None:
        return None
    run = fitter.run(emptied(devices) if devices else None, 1)
    return run.failure if not run.pods else None


def domain_text(levels: Sequence[str], key: tuple[str, ...]) -> str:
    """A domain as its users label it: ``rack b0-r1 (block b0)``, the value of its own level
    and those of the levels above it (a rack value may repeat across blocks)."""
    own = f"{_short(levels[len(key) - 1])} {key[-1]}"
    above = ", ".join(f"{_short(lv)} {v}" for lv, v in zip(levels, key[:-1], strict=False)
                      if v != ABSENT)
    return f"{own} ({above})" if above else own


def validate(request: GangRequest, snapshot: Snapshot) -> list[Reason]:
    """Malformed requests: nothing to plan, retrying cannot help."""
    reasons: list[Reason] = []
    if not request.pod_sets:
        reasons.append(Reason(ReasonCode.INVALID, None, "the request has no pod sets"))
    seen: set[str] = set()
    for ps in request.pod_sets:
        if ps.name in seen:
            reasons.append(Reason(ReasonCode.INVALID, ps.name, f"pod set name {ps.name} repeats"))
        seen.add(ps.name)
        if ps.count < 1:
            reasons.append(
                Reason(ReasonCode.INVALID, ps.name, f"pod set {ps.name}: count {ps.count} < 1")
            )
        negative = sorted(r for r, v in ps.shape.requests.items() if v < 0)
        if negative:
            reasons.append(
                Reason(
                    ReasonCode.INVALID,
                    ps.name,
                    f"pod set {ps.name}: negative request for {', '.join(negative)}",
                )
            )
        topo = ps.topology
        if topo.mode is not TopologyMode.NONE:
            if topo.level is None:
                reasons.append(
                    Reason(
                        ReasonCode.INVALID,
                        ps.name,
                        f"pod set {ps.name}: {topo.mode.value} topology without a level",
                    )
                )
            elif topo.level not in snapshot.levels:
                known = ", ".join(snapshot.levels) or "none configured"
                reasons.append(
                    Reason(
                        ReasonCode.INVALID,
                        ps.name,
                        f"pod set {ps.name}: unknown topology level {topo.level} "
                        f"(levels: {known})",
                    )
                )
        if topo.slice_level is not None:
            reasons.extend(Reason(ReasonCode.INVALID, ps.name, f"pod set {ps.name}: {why}")
                           for why in _slice_problems(ps, snapshot))
            if ps.shape.spread is not None:
                reasons.append(Reason(
                    ReasonCode.UNSUPPORTED, ps.name,
                    f"pod set {ps.name}: a topology spread constraint on "
                    f"{ps.shape.spread.key} together with slices of {topo.slice_size} pods in "
                    f"one {topo.slice_level} is not planned"))
        reasons.extend(
            Reason(ReasonCode.INVALID, ps.name, f"pod set {ps.name}: {claim.error}")
            for claim in ps.shape.claims
            if claim.error
        )
        reasons.extend(
            Reason(ReasonCode.UNSUPPORTED, ps.name, f"pod set {ps.name}: {why}")
            for why in ps.shape.unsupported
        )
    return reasons


def _slice_problems(ps: PodSetRequest, snapshot: Snapshot) -> list[str]:
    topo = ps.topology
    if topo.slice_level not in snapshot.levels:
        known = ", ".join(snapshot.levels) or "none configured"
        return [f"unknown slice topology level {topo.slice_level} (levels: {known})"]
    if topo.slice_size < 1 or ps.count % topo.slice_size:
        return [f"slice size {topo.slice_size} does not divide the pod count {ps.count}"]
    return []


def _exclusions(
    ps: PodSetRequest, nodes: tuple[NodeState, ...], ws: Workspace,
    fitter: ClaimFitter | None = None,
) -> str:
    unschedulable = taint = selector = small = no_devices = 0
    taint_names: set[str] = set()
    device_why: dict[str, int] = {}
    misses: dict[str, int] = {}
    for node in nodes:
        if not node.schedulable:
            unschedulable += 1
            continue
        if not selector_matches(ps.shape, node.labels, node.name):
            selector += 1
            miss = _selector_miss(ps.shape, node.labels, node.name)
            misses[miss] = misses.get(miss, 0) + 1
            continue
        blocking = untolerated(node.taints, ps.shape.tolerations)
        if blocking:
            taint += 1
            taint_names.update(f"{t.key}={t.value}:{t.effect}" for t in blocking)
            continue
        if resource_fit(ps.shape.requests, node.allocatable) == 0:
            small += 1
            continue
        why = _device_failure(fitter, node.devices)
        if why is not None:
            no_devices += 1
            device_why[why] = device_why.get(why, 0) + 1
    parts = []
    if unschedulable:
        parts.append(f"{unschedulable} unschedulable or NotReady")
    if selector:
        # The clauses that excluded the most nodes first, each with its count.
        top = sorted(misses, key=lambda m: (-misses[m], m))
        parts.append(f"{selector} outside " + ", ".join(
            f"{m} ({misses[m]})" if len(top) > 1 else m for m in top[:3]))
    if taint:
        parts.append(f"{taint} with untolerated taints ({', '.join(sorted(taint_names)[:3])})")
    if small:
        parts.append(f"{small} too small even when empty")
    if no_devices:
        # The most common device failure: the one an operator should look at first.
        why = min(device_why, key=lambda w: (-device_why[w], w))
        parts.append(f"{no_devices} without the devices its claims need ({why})")
    return "; ".join(parts) if parts else "the snapshot has no nodes"


def _requirement_text(req: SelectorRequirement) -> str:
    values = f" ({', '.join(req.values)})" if req.values else ""
    return f"{req.key} {req.operator}{values}"


def _selector_miss(shape: PodShape, labels: Mapping[str, str], name: str | None) -> str:
    """The first clause of the pod's node selection a node fails, as the pod spec says it."""
    if shape.node_name is not None and shape.node_name != name:
        return f"its spec.nodeName {shape.node_name}"
    for key, value in sorted(shape.node_selector.items()):
        if labels.get(key) != value:
            return f"its nodeSelector {key}={value}"
    failing = []
    for term in shape.affinity_terms:
        for req in term.match_expressions:
            if not requirement_matches(req, labels.get(req.key)):
                failing.append(_requirement_text(req))
                break
        else:
            failing.append("matchFields " + ", ".join(_requirement_text(r)
                                                     for r in term.match_fields))
    return "its required node affinity " + " or ".join(failing or ["(no term)"])


def _any_match(
    ps: PodSetRequest, snapshot: Snapshot, ws: Workspace, fitter: ClaimFitter | None = None
) -> bool:
    """Some usable node or pool template could run one pod if it were empty."""
    for node in snapshot.nodes:
        if node.schedulable and pods_that_fit(
            ps.shape, node.allocatable, node.labels, node.taints, node_name=node.name,
            devices=emptied(node.devices) if node.devices else None, fitter=fitter,
        ):
            return True
    return any(
        pods_that_fit(ps.shape, ref.pool.allocatable, ref.labels, ref.pool.taints,
                      devices=ref.pool.devices, fitter=fitter)
        for ref in ws.index.refs
    )


def _pool_device_failures(ws: Workspace, fitter: ClaimFitter | None) -> str:
    if fitter is None:
        return ""
    seen: dict[str, str] = {}
    for ref in ws.index.refs:
        why = _device_failure(fitter, ref.pool.devices)
        if why is not None and ref.pool.name not in seen:
            seen[ref.pool.name] = why
    return "".join(f"; pool {name}: {why}" for name, why in sorted(seen.items()))


def _pool_room(batches: list[Batch], ws: Workspace) -> tuple[int, list[str]]:
    """Pods the batches can add (pool-wide limits applied) and per-pool phrases."""
    by_pool: dict[int, list[Batch]] = {}
    for b in batches:
        by_pool.setdefault(b.ref.pool_index, []).append(b)
    room = 0
    phrases: list[str] = []
    for pi in sorted(by_pool, key=lambda i: ws.index.pools[i].name):
        group = sorted(by_pool[pi], key=lambda b: -b.per_node)
        left = ws.pool_headroom(pi)
        nodes = 0
        for b in group:
            k = min(left, b.nodes)
            room += k * b.per_node
            left -= k
            nodes += k
        limits = sorted({b.ref.domain.max_nodes for b in group if b.ref.domain.max_nodes})
        limit = f" (its domain limit is {limits[0]})" if len(limits) == 1 else ""
        if ws.index.pools[pi].reserved or ws.index.pools[pi].reserved_busy:
            limit = " (what the reservation it draws from has free)"
        phrases.append(f"pool {ws.index.pools[pi].name} can add {nodes} more nodes there{limit}")
    return room, phrases


def explain(
    ps: PodSetRequest, ws: Workspace, snapshot: Snapshot, mode: Mode
) -> Reason:
    """Why ``ps`` does not fit on ``ws``."""
    placer = PodSetPlacer(ws, ps, mode)
    existing = placer.existing_room()
    suffix = "" if mode is Mode.PROVISION else " (check mode: existing nodes only)"
    fitter = ClaimFitter(ps.shape.claims) if ps.shape.claims else None
    if not placer.cands and not placer.batches and not _any_match(ps, snapshot, ws, fitter):
        pools = ""
        if mode is Mode.PROVISION and ws.index.pools:
            pools = "; no pool has a matching node template" + _pool_device_failures(ws, fitter)
        return Reason(
            ReasonCode.NO_MATCHING_NODES,
            ps.name,
            f"{_needs(ps)}; no node has room for one: "
            f"{_exclusions(ps, snapshot.nodes, ws, fitter)}{pools}{suffix}",
            needed=ps.count,
        )
    topo = ps.topology
    if applies(topo, ws.index.levels):
        return _explain_slices(placer, suffix)
    if topo.mode is TopologyMode.REQUIRED and topo.level is not None:
        return _explain_required(placer, topo.level, suffix)
    new_room, phrases = _pool_room(placer.batches, ws)
    msg = f"{_needs(ps)}; existing nodes have room for {existing}"
    code = ReasonCode.INSUFFICIENT_CAPACITY
    if mode is Mode.PROVISION:
        msg += "; " + ("; ".join(p.replace(" there", "") for p in phrases) if phrases
                       else "no pool can add matching nodes")
        if any(ws.pool_headroom(b.ref.pool_index) < b.ref.domain.max_new_nodes
               for b in placer.batches):
            code = ReasonCode.POOL_LIMIT
    return Reason(code, ps.name, msg + suffix, needed=ps.count, best=existing + new_room)


def _explain_required(placer: PodSetPlacer, level: str, suffix: str) -> Reason:
    ps, ws, mode = placer.ps, placer.ws, placer.mode
    depth = ws.index.levels.index(level)
    if depth == len(ws.index.levels.domain):
        best_node = max((c for _, c in placer.cands), default=0)  # per node
        new = max((b.per_node for b in placer.batches), default=0)
        tail = f"; a new node holds {new}" if placer.batches else ""
        return Reason(
            ReasonCode.TOPOLOGY,
            ps.name,
            f"{_needs(ps)} on one node; the best node has room for {best_node}{tail}{suffix}",
            needed=ps.count,
            best=max(best_node, new),
            level=level,
        )
    caps = placer.domain_caps(depth)
    by_key: dict[tuple[str, ...], list[Batch]] = {}
    for b in placer.batches:
        if within(b.ref.path, depth):
            by_key.setdefault(b.ref.path[: depth + 1], []).append(b)
    rooms: dict[tuple[str, ...], tuple[int, int, list[str]]] = {}
    for key in set(caps) | set(by_key):
        new_room, phrases = _pool_room(by_key.get(key, []), ws)
        rooms[key] = (caps.get(key, 0), new_room, phrases)
    name = level.rsplit("/", 1)[-1]
    if not rooms:
        return Reason(
            ReasonCode.TOPOLOGY,
            ps.name,
            f"{_needs(ps)} within one value of {name}; no matching node carries the "
            f"{level} label{suffix}",
            needed=ps.count,
            level=level,
        )
    # The domain closest to fitting (existing + new), then the most existing, then by name.
    key = min(rooms, key=lambda k: (-(rooms[k][0] + rooms[k][1]), -rooms[k][0], k))
    have, new_room, phrases = rooms[key]
    msg = (
        f"{_needs(ps)} within one value of {name}; the best is "
        f"{domain_text(ws.index.levels.domain, key)} with room for {have}"
    )
    code = ReasonCode.TOPOLOGY
    if mode is Mode.PROVISION:
        msg += "; " + ("; ".join(phrases) if phrases else "no pool can add nodes there")
        if any(ws.pool_headroom(b.ref.pool_index) < b.ref.domain.max_new_nodes
               for b in by_key.get(key, [])):
            code = ReasonCode.POOL_LIMIT
    return Reason(code, ps.name, msg + suffix, needed=ps.count, best=have + new_room,
                  level=level, domain="/".join(key))


def shortfall(result: NoFit) -> str:
    """One sentence per failed pod set saying by how much it misses and where it came
    closest, then whether waiting can help: the headline of a waiting request's condition.

    E.g. "pod set workers is short by 3 pod(s): it must fit within one rack and the closest
    rack, b1/b1-r2, can hold 5 of 8 (existing nodes plus what pools can add). More capacity
    can appear: ..."
    """
    parts = []
    seen: set[str | None] = set()
    # The empty-cluster shortfall (NeverFits) first: it is why such a request fails, and
    # the detail states its figures first, so a headline with today's (smaller) figures
    # would contradict it. Today's shortfall for the other pod sets.
    ordered = sorted(result.reasons, key=lambda r: r.code is not ReasonCode.NEVER_FITS)
    for r in ordered:
        if r.code in (ReasonCode.INVALID, ReasonCode.UNSUPPORTED):
            continue
        if r.pod_set in seen or r.needed <= 0:
            continue
        seen.add(r.pod_set)
        short = max(0, r.needed - r.best)
        what = f"pod set {r.pod_set} is short by {short} pod(s)"
        if r.code is ReasonCode.NEVER_FITS:
            what += " even in an empty cluster"
        if r.level is not None and r.domain is not None:
            name = r.level.rsplit("/", 1)[-1]
            parts.append(f"{what}: it must fit within one {name} and the closest {name}, "
                         f"{r.domain}, can hold {r.best} of {r.needed}")
        elif r.level is not None:
            parts.append(f"{what}: it must fit within one "
                         f"{r.level.rsplit('/', 1)[-1]}, and the best holds {r.best} of "
                         f"{r.needed}")
        else:
            parts.append(f"{what}: the cluster can hold {r.best} of {r.needed}")
    codes = {r.code for r in result.reasons}
    if ReasonCode.INVALID in codes or ReasonCode.UNSUPPORTED in codes:
        tail = "Waiting cannot help: the request itself must change."
    elif ReasonCode.NEVER_FITS in codes:
        tail = ("More capacity can never appear: not even an empty cluster with every pool "
                "at its maximum holds the gang.")
    elif result.mode is Mode.CHECK:
        tail = ("More capacity can appear when running pods finish or other bookings end "
                "(check-capacity adds no nodes).")
    else:
        tail = ("More capacity can appear: the gang fits an empty cluster with every pool at "
                "its maximum, so it fits once running pods finish, other bookings end, or "
                "stock returns.")
    head = "; ".join(parts)
    return f"{head[0].upper()}{head[1:]}. {tail}" if head else tail


def _explain_slices(placer: PodSetPlacer, suffix: str) -> Reason:
    """Slices that do not fit: how many whole slices the best domain of the pod set's
    required level (else the cluster) holds, on existing nodes and with new ones."""
    ps, ws, mode = placer.ps, placer.ws, placer.mode
    topo = ps.topology
    assert topo.slice_level is not None
    size, need = topo.slice_size, ps.count // topo.slice_size
    sdepth = ws.index.levels.index(topo.slice_level)
    node_level = sdepth == len(ws.index.levels.domain)
    depth = (ws.index.levels.index(topo.level) if topo.mode is TopologyMode.REQUIRED
             and topo.level is not None else -1)
    # Per slice domain (a node, for hostname slices): existing pods' room, new pods' room.
    units: list[tuple[tuple[str, ...], int, int]] = []
    if node_level:
        units += [(cls.path, c // size * size, 0) for cls, c in placer.cands
                  for _ in cls.members]
        units += [(b.ref.path, 0, b.per_node // size * size * b.nodes) for b in placer.batches]
    else:
        caps = placer.domain_caps(sdepth)
        news: dict[tuple[str, ...], list[Batch]] = {}
        for b in placer.batches:
            if within(b.ref.path, sdepth):
                news.setdefault(b.ref.path[: sdepth + 1], []).append(b)
        for key in set(caps) | set(news):
            units.append((key, caps.get(key, 0), _pool_room(news.get(key, []), ws)[0]))
    tops: dict[tuple[str, ...], list[int]] = {}
    for key, have, new in units:
        if depth >= 0 and not within(key, depth):
            continue
        top = tops.setdefault(key[: depth + 1] if depth >= 0 else (), [0, 0])
        top[0] += have // size
        top[1] += (have + new) // size - have // size if not node_level else new // size
    if not tops:
        msg = f"{_needs(ps)}; no matching node carries the {topo.slice_level} label"
        return Reason(ReasonCode.TOPOLOGY, ps.name, msg + suffix, needed=need)
    key = min(tops, key=lambda k: (-sum(tops[k]), -tops[k][0], k))
    have, new = tops[key]
    if depth >= 0:
        outer = f" within one value of {_short(ws.index.levels.domain[depth])}"
        where = f"; the best is {domain_text(ws.index.levels.domain, key)}, which"
    else:
        outer, where = "", "; the cluster"
    msg = (f"{_needs(ps)}{outer}{_slices(ps)}{where} holds {have} of the {need} slices on "
           "existing nodes")
    if mode is Mode.PROVISION:
        msg += (f" and {new} more on the new nodes its pools can add" if placer.batches
                else "; no pool can add matching nodes")
    return Reason(ReasonCode.TOPOLOGY, ps.name, msg + suffix, needed=need, best=have + new)
