"""Device allocation: "how many pods with these ResourceClaims fit on this node's devices".

Modelled on the scheduler's structured allocator (k8s.io/dynamic-resource-allocation
``structured``): for one pod, a depth-first search over its claims, their requests (and
``firstAvailable`` subrequests, in order) and the node's devices (in inventory order), with
backtracking; a device must pass the DeviceClass's and the request's CEL selectors, have its
NoSchedule/NoExecute taints tolerated, be free (or, with ``allowMultipleAllocations``, have
the requested capacity left after applying its ``requestPolicy``), find its
``consumesCounters`` available in the pool's ``sharedCounters``, and satisfy every
``matchAttribute``/``distinctAttribute`` constraint of the claim. The first solution wins
(no scoring), like the scheduler. ``allocationMode: All`` takes every matching device and
fails if one of them is not available. The search is bounded by :data:`SEARCH_BUDGET` steps
per pod; running out counts as "does not fit" and is said so in the reason.

Pods are allocated one after another on a working copy of the node's :class:`DeviceState`
until one does not fit: that is what the scheduler would do pod by pod. Results are
memoised per (inventory, state, identity attributes the gang reads), so identical nodes cost
one search.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from controller.fit.cel import Selector, device_value
from controller.fit.dra_types import (
    ALL,
    EMPTY_CAPACITY,
    EMPTY_STATE,
    AttrValue,
    ClaimAllocation,
    ClaimShape,
    CounterKey,
    Device,
    DeviceRequest,
    DeviceResult,
    DeviceShape,
    DeviceState,
    DeviceToleration,
    NodeDevices,
    PodDevices,
    RequestPolicy,
)

MAX_DEVICES_PER_CLAIM = 32
"""resource.k8s.io/v1: an allocation result holds at most 32 devices."""

SEARCH_BUDGET = 200_000
"""Device choices tried per pod before giving up (the scheduler bounds its search by a
10 s filter timeout instead)."""

BLOCKING = frozenset({"NoSchedule", "NoExecute"})

Pick = tuple[int, int, int, tuple[tuple[str, int], ...]]
"""(claim index, request index, device index, consumed capacity) of one allocated device;
the alternative chosen is in :class:`PodAllocation`."""


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """One pod's allocation in index form (resolved to names by :func:`resolve`)."""

    picks: tuple[Pick, ...]
    alternatives: tuple[tuple[int, int, int], ...]
    """(claim, request, alternative chosen)."""
    named: tuple[tuple[int, str, str, int, str, Mapping[str, int], bool], ...] = ()
    """Per pick: (claim index, request name, driver, pool index, device name, consumed
    capacity, adminAccess), so resolving for each node only looks up its pool names."""


@dataclass(frozen=True, slots=True)
class Run:
    """Pods allocated one after another on one device state."""

    pods: tuple[PodAllocation, ...]
    states: tuple[DeviceState, ...]
    """State after 1, 2, ... pods."""
    failure: str | None
    """Why one more pod does not fit (None when stopped by ``limit``)."""
    limit: int


# ---------------------------------------------------------------------------- helpers


def _tolerates(tol: DeviceToleration, key: str, value: str, effect: str) -> bool:
    if tol.effect and tol.effect != effect:
        return False
    if tol.operator == "Exists":
        return not tol.key or tol.key == key
    return tol.key == key and tol.value == value


def tolerated(device: Device, tolerations: Sequence[DeviceToleration]) -> bool:
    return all(
        t.effect not in BLOCKING or any(_tolerates(x, t.key, t.value, t.effect)
                                        for x in tolerations)
        for t in device.taints
    )


def consumed_amount(requested: int | None, total: int, policy: RequestPolicy | None) -> int | None:
    """Capacity one allocation of a shared device consumes (KEP-5075), None if the request
    is not allowed by the policy.

    No request: the policy's default, else the whole capacity. ``validValues``: the smallest
    valid value at least the request. ``validRange``: at least ``min``, rounded up to
    ``min + k*step``, at most ``max``.
    """
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return total
    if policy is None:
        return requested
    if policy.valid_values:
        for v in policy.valid_values:
            if v >= requested:
                return v
        return None
    amount = requested
    if policy.min is not None:
        amount = max(amount, policy.min)
        if policy.step:
            over = amount - policy.min
            amount = policy.min + -(-over // policy.step) * policy.step
    if policy.max is not None and amount > policy.max:
        return None
    return amount


def _typed(value: AttrValue) -> tuple[str, AttrValue]:
    # 1 and True are different attribute values (int vs bool), as in the API.
    return (type(value).__name__, value)


# ---------------------------------------------------------------------------- preparation


@dataclass(frozen=True, slots=True)
class _Alt:
    request: DeviceRequest
    candidates: tuple[int, ...]
    """Devices passing selectors, taints and static capacity checks, in inventory order."""
    consume: tuple[tuple[tuple[str, int], ...] | None, ...]
    """Per candidate: capacity consumed on a shared device (None for an exclusive one)."""
    constraints: tuple[int, ...] = ()
    """Constraints (indexes into the prepared list) the devices of this alternative obey:
    those naming its request, or this very subrequest (``gpu/big``), or every request."""


@dataclass(frozen=True, slots=True)
class _Req:
    claim: int
    index: int
    name: str
    alts: tuple[_Alt, ...]

    @property
    def constraints(self) -> tuple[int, ...]:
        """Constraints any alternative of the request obeys."""
        return tuple(sorted({k for a in self.alts for k in a.constraints}))


@dataclass(frozen=True, slots=True)
class _Constraint:
    attribute: str
    match: bool


class _Prepared:
    """Candidates per request alternative for one inventory (and identity projection)."""

    def __init__(self, claims: Sequence[ClaimShape], devices: NodeDevices) -> None:
        self.devices = devices
        inv = devices.shape.inventory
        self.inventory = inv
        self.attrs: list[Mapping[str, AttrValue]] = [
            devices.attributes(i) for i in range(len(inv.devices))
        ]
        self._cel_cache: dict[tuple[int, int], bool] = {}
        self.constraints: list[_Constraint] = []
        reqs: list[_Req] = []
        for ci, claim in enumerate(claims):
            scoped: list[tuple[int, frozenset[str] | None]] = []
            for con in claim.constraints:
                attr = con.match_attribute or con.distinct_attribute
                if attr is None:
                    continue
                scoped.append((len(self.constraints), frozenset(con.requests) or None))
                self.constraints.append(_Constraint(attr, con.match_attribute is not None))
            for ri, req in enumerate(claim.requests):
                alts = []
                for alt in req.alternatives:
                    # "gpu" covers every subrequest of gpu; "gpu/big" only that one.
                    mine = tuple(k for k, names in scoped
                                 if names is None or req.name in names or alt.name in names)
                    alts.append(replace(self._alt(alt), constraints=mine))
                reqs.append(_Req(ci, ri, req.name, tuple(alts)))
        self.requests = tuple(reqs)

    def _selected(self, selectors: tuple[Selector, ...], index: int) -> bool:
        value: dict[str, Any] | None = None
        for sel in selectors:
            key = (id(sel), index)
            hit = self._cel_cache.get(key)
            if hit is None:
                if value is None:
                    dev = self.inventory.devices[index]
                    value = device_value(dev.driver, self.attrs[index], dev.capacity,
                                         dev.allow_multiple)
                hit = sel.matches(value)
                self._cel_cache[key] = hit
            if not hit:
                return False
        return True

    def _alt(self, req: DeviceRequest) -> _Alt:
        cands: list[int] = []
        consume: list[tuple[tuple[str, int], ...] | None] = []
        for i, dev in enumerate(self.inventory.devices):
            if not self._selected(req.selectors, i) or not tolerated(dev, req.tolerations):
                continue
            # An unqualified capacity name in a request means the device driver's domain.
            wanted = {n if "/" in n else f"{dev.driver}/{n}": v for n, v in req.capacity.items()}
            if any(name not in dev.capacity for name in wanted):
                continue
            if dev.allow_multiple:
                amounts: list[tuple[str, int]] = []
                ok = True
                for name, total in sorted(dev.capacity.items()):
                    got = consumed_amount(wanted.get(name), total, dev.policies.get(name))
                    if got is None or got > total:
                        ok = False
                        break
                    amounts.append((name, got))
                if not ok:
                    continue
                cands.append(i)
                consume.append(tuple(amounts))
            else:
                if any(dev.capacity[n] < amount for n, amount in wanted.items()):
                    continue
                cands.append(i)
                consume.append(None)
        return _Alt(req, tuple(cands), tuple(consume))


# ---------------------------------------------------------------------------- the search


class _Search:
    """One pod's depth-first search on a working copy of a device state."""

    def __init__(self, prep: _Prepared, state: DeviceState, budget: int) -> None:
        self.prep = prep
        self.inv = prep.inventory
        self.used = set(state.used)
        self.shared = set(state.shared)
        self.cap: dict[int, dict[str, int]] = {d: dict(v) for d, v in state.capacity}
        self.counters: dict[CounterKey, dict[str, int]] = {k: dict(v) for k, v in
                                                           state.counters}
        self.pins: list[tuple[str, AttrValue] | None] = [None] * len(prep.constraints)
        self.pin_count = [0] * len(prep.constraints)
        self.seen: list[dict[tuple[str, AttrValue], int]] = [{} for _ in prep.constraints]
        self.picks: list[Pick] = []
        self.here: set[int] = set()
        """Devices this pod holds whole or through adminAccess: one such device never serves
        two of its requests (a shared device may serve several, each its own share)."""
        self.per_claim = [0] * (1 + max((r.claim for r in prep.requests), default=0))
        self.alts: list[tuple[int, int, int]] = []
        self.budget = budget
        self.exhausted = False
        self.deepest = -1

    # -- availability of one device for one alternative

    def _counters_ok(self, dev: Device) -> bool:
        for use in dev.consumes:
            key = (dev.driver, dev.pool, use.counter_set)
            have = self.inv.counters.get(key)
            if have is None:
                return False
            taken = self.counters.get(key, {})
            for name, amount in use.counters.items():
                if taken.get(name, 0) + amount > have.get(name, 0):
                    return False
        return True

    def _constraints_ok(self, alt: _Alt, index: int) -> bool:
        attrs = self.prep.attrs[index]
        for k in alt.constraints:
            con = self.prep.constraints[k]
            value = attrs.get(con.attribute)
            if value is None:
                return False
            typed = _typed(value)
            if con.match:
                pin = self.pins[k]
                if pin is not None and pin != typed:
                    return False
            elif self.seen[k].get(typed, 0) > 0:
                return False
        return True

    def _available(self, req: _Req, alt: _Alt, pos: int) -> bool:
        index = alt.candidates[pos]
        dev = self.inv.devices[index]
        if index in self.here or self.per_claim[req.claim] >= MAX_DEVICES_PER_CLAIM:
            return False
        if alt.request.admin_access:  # in use or not, and it stays available to others
            return self._constraints_ok(alt, index)
        if index in self.used:
            return False
        amounts = alt.consume[pos]
        if amounts is None:
            if index in self.shared:
                return False
        else:
            taken = self.cap.get(index, {})
            for name, amount in amounts:
                if taken.get(name, 0) + amount > dev.capacity[name]:
                    return False
        return self._counters_ok(dev) and self._constraints_ok(alt, index)

    # -- applying and undoing one device

    def _apply(self, req: _Req, alt: _Alt, pos: int) -> None:
        index = alt.candidates[pos]
        dev = self.inv.devices[index]
        admin = alt.request.admin_access
        amounts = None if admin else alt.consume[pos]
        if amounts is None:
            self.here.add(index)
        # adminAccess may use a busy device and holds nothing of it.
        if not admin:
            if amounts is None:
                self.used.add(index)
            else:
                slot = self.cap.setdefault(index, {})
                for name, amount in amounts:
                    slot[name] = slot.get(name, 0) + amount
        for use in () if admin else dev.consumes:
            cslot = self.counters.setdefault((dev.driver, dev.pool, use.counter_set), {})
            for name, amount in use.counters.items():
                cslot[name] = cslot.get(name, 0) + amount
        attrs = self.prep.attrs[index]
        for k in alt.constraints:
            con = self.prep.constraints[k]
            typed = _typed(attrs[con.attribute])
            if con.match:
                if self.pin_count[k] == 0:
                    self.pins[k] = typed
                self.pin_count[k] += 1
            else:
                self.seen[k][typed] = self.seen[k].get(typed, 0) + 1
        self.picks.append((req.claim, req.index, index, amounts or ()))
        self.per_claim[req.claim] += 1

    def _undo(self, req: _Req, alt: _Alt, pos: int) -> None:
        index = alt.candidates[pos]
        dev = self.inv.devices[index]
        admin = alt.request.admin_access
        amounts = None if admin else alt.consume[pos]
        if amounts is None:
            self.here.discard(index)
        if not admin:  # adminAccess held nothing (see _apply)
            if amounts is None:
                self.used.discard(index)
            else:
                slot = self.cap[index]
                for name, amount in amounts:
                    slot[name] -= amount
                if not any(slot.values()):
                    del self.cap[index]
        for use in () if admin else dev.consumes:
            cslot = self.counters[(dev.driver, dev.pool, use.counter_set)]
            for name, amount in use.counters.items():
                cslot[name] -= amount
        attrs = self.prep.attrs[index]
        for k in alt.constraints:
            con = self.prep.constraints[k]
            typed = _typed(attrs[con.attribute])
            if con.match:
                self.pin_count[k] -= 1
                if self.pin_count[k] == 0:
                    self.pins[k] = None
            else:
                self.seen[k][typed] -= 1
        self.picks.pop()
        self.per_claim[req.claim] -= 1

    # -- the depth-first search

    def _step(self) -> bool:
        self.budget -= 1
        if self.budget < 0:
            self.exhausted = True
            return False
        return True

    def request(self, r: int) -> bool:
        """Allocate requests ``r..`` (flattened over claims); True on the first solution."""
        if r == len(self.prep.requests):
            return True
        self.deepest = max(self.deepest, r)
        req = self.prep.requests[r]
        for ai, alt in enumerate(req.alts):
            if (alt.request.mode != ALL and self.per_claim[req.claim] + alt.request.count
                    > MAX_DEVICES_PER_CLAIM):
                continue  # cannot fit in one claim: no need to search for it
            self.alts.append((req.claim, req.index, ai))
            if alt.request.mode == ALL:
                ok = self._all(r, req, alt)
            else:
                ok = self._pick(r, req, alt, alt.request.count, 0)
            if ok:
                return True
            self.alts.pop()
            if self.exhausted:
                return False
        return False

    def _all(self, r: int, req: _Req, alt: _Alt) -> bool:
        if not alt.candidates:
            return False  # All needs at least one matching device
        done = 0
        for pos in range(len(alt.candidates)):
            if not self._step() or not self._available(req, alt, pos):
                break
            self._apply(req, alt, pos)
            done += 1
        if done == len(alt.candidates) and self.request(r + 1):
            return True
        for pos in range(done - 1, -1, -1):
            self._undo(req, alt, pos)
        return False

    def _pick(self, r: int, req: _Req, alt: _Alt, left: int, start: int) -> bool:
        if left == 0:
            return self.request(r + 1)
        n = len(alt.candidates)
        for pos in range(start, n - left + 1):
            if not self._step():
                return False
            if not self._available(req, alt, pos):
                continue
            self._apply(req, alt, pos)
            if self._pick(r, req, alt, left - 1, pos + 1):
                return True
            self._undo(req, alt, pos)
            if self.exhausted:
                return False
        return False

    def state(self) -> DeviceState:
        shared = set(self.shared)
        shared.update(self.cap)
        return DeviceState(
            used=frozenset(self.used),
            counters=tuple(sorted((k, tuple(sorted((n, a) for n, a in v.items() if a)))
                                  for k, v in self.counters.items() if any(v.values()))),
            capacity=tuple(sorted((d, tuple(sorted((n, a) for n, a in v.items() if a)))
                                  for d, v in self.cap.items())),
            shared=frozenset(shared),
        )


# ---------------------------------------------------------------------------- public


def identity_names_read(claims: Sequence[ClaimShape]) -> frozenset[str] | None:
    """Attribute ids (the part after the domain) the claims' selectors and constraints can
    read; None if a selector may read any attribute."""
    names: set[str] = set()
    for claim in claims:
        for con in claim.constraints:
            attr = con.match_attribute or con.distinct_attribute
            if attr:
                names.add(attr.rsplit("/", 1)[-1])
        for req in claim.requests:
            for alt in req.alternatives:
                for sel in alt.selectors:
                    if sel.names is None:
                        return None
                    names.update(sel.names)
    return frozenset(names)


class ClaimFitter:
    """Memoised device fit of one pod shape's claims (one per pod set and plan)."""

    __slots__ = ("_prepared", "_read", "_runs", "budget", "claims")

    def __init__(self, claims: Sequence[ClaimShape], budget: int = SEARCH_BUDGET) -> None:
        self.claims = tuple(claims)
        self.budget = budget
        self._read = identity_names_read(self.claims)
        self._prepared: dict[tuple[object, ...], _Prepared] = {}
        self._runs: dict[tuple[object, ...], Run] = {}

    def _projection(self, devices: NodeDevices) -> tuple[object, ...] | None:
        inv = devices.shape.inventory
        if not inv.identity_names or not devices.identity:
            return None
        if self._read is None:
            wanted = inv.identity_names
        else:
            wanted = frozenset(n for n in inv.identity_names
                               if n.rsplit("/", 1)[-1] in self._read)
        if not wanted:
            return None
        return tuple(tuple(sorted((k, _typed(v)) for k, v in ident.items() if k in wanted))
                     for ident in devices.identity)

    def key(self, devices: NodeDevices | None) -> tuple[object, ...]:
        """What makes two nodes' devices equivalent for these claims."""
        if devices is None:
            return ()
        shape = devices.shape
        return (id(shape.inventory), shape.state, self._projection(devices))

    def run(self, devices: NodeDevices | None, limit: int) -> Run:
        """Allocate up to ``limit`` pods one after another; memoised (the run returned may
        hold more pods than ``limit`` when an earlier call asked for more)."""
        if limit <= 0:
            return Run((), (), None, limit)
        if devices is None or not devices.shape.inventory.devices:
            return Run((), (), "the node publishes no devices", limit)
        key = self.key(devices)
        hit = self._runs.get(key)
        if hit is not None and (hit.failure is not None or hit.limit >= limit):
            return hit
        pkey = (key[0], key[2])
        prep = self._prepared.get(pkey)
        if prep is None:
            prep = _Prepared(self.claims, devices)
            self._prepared[pkey] = prep
        pods: list[PodAllocation] = []
        states: list[DeviceState] = []
        state = devices.shape.state
        failure: str | None = None
        while len(pods) < limit:
            search = _Search(prep, state, self.budget)
            if not search.request(0):
                failure = self._why(prep, search)
                break
            pods.append(self._plan(prep, search))
            state = search.state()
            states.append(state)
        got = Run(tuple(pods), tuple(states), failure, limit)
        self._runs[key] = got
        return got

    def _plan(self, prep: _Prepared, search: _Search) -> PodAllocation:
        chosen = {(c, r): a for c, r, a in search.alts}
        named = []
        for c, r, index, amounts in search.picks:
            dev = prep.inventory.devices[index]
            alt = self.claims[c].requests[r].alternatives[chosen[(c, r)]]
            named.append((c, alt.name, dev.driver, dev.pool, dev.name,
                          dict(amounts) if amounts else EMPTY_CAPACITY, alt.admin_access))
        return PodAllocation(tuple(search.picks), tuple(search.alts), tuple(named))

    def count(self, devices: NodeDevices | None, limit: int) -> int:
        """Pods (at most ``limit``) whose claims can be allocated one after another."""
        return min(len(self.run(devices, limit).pods), limit)

    # -- explanations

    def _why(self, prep: _Prepared, search: _Search) -> str:
        if search.exhausted:
            return (f"the device search gave up after {self.budget} steps "
                    f"({self.describe_claims()})")
        if not prep.requests:
            return "the claims request no devices"
        r = prep.requests[max(search.deepest, 0)]
        return explain_request(self.claims, prep, r, search)

    def describe_claims(self) -> str:
        return "; ".join(describe_claim(c) for c in self.claims)


def _alt_phrase(req: DeviceRequest) -> str:
    if req.mode == ALL:
        return f"all devices of class {req.device_class}"
    noun = "device" if req.count == 1 else "devices"
    return f"{req.count} {noun} of class {req.device_class}"


def _request_phrase(alts: Sequence[DeviceRequest]) -> str:
    return " or ".join(_alt_phrase(a) for a in alts)


def describe_claim(claim: ClaimShape) -> str:
    """``claim template train (2 devices of class gpu.nvidia.com + 1 device of class nic,
    matching resource.kubernetes.io/pcieRoot)``."""
    parts = [_request_phrase(r.alternatives) for r in claim.requests]
    cons = []
    for c in claim.constraints:
        which = "matching" if c.match_attribute else "distinct"
        cons.append(f"{which} {c.match_attribute or c.distinct_attribute}")
    tail = f", {', '.join(cons)}" if cons else ""
    return f"{_source_phrase(claim)} ({' + '.join(parts)}{tail})"


def _source_phrase(claim: ClaimShape) -> str:
    kind, _, name = claim.source.partition(" ")
    short = name.rsplit("/", 1)[-1]
    if kind == "ResourceClaimTemplate":
        return f"claim template {short}"
    if kind == "ResourceClaim":
        return f"claim {short}"
    return claim.source


def explain_request(
    claims: Sequence[ClaimShape], prep: _Prepared, r: _Req, search: _Search
) -> str:
    """Why request ``r`` found no devices: too few match, too few are free, or the
    constraints/counters cannot be met together with the other requests."""
    claim = claims[r.claim]
    head = f"request {r.name} of {_source_phrase(claim)}"
    alts = [a.request for a in r.alts]
    matching = max((len(a.candidates) for a in r.alts), default=0)
    if all(a.request.mode != ALL and a.request.count > MAX_DEVICES_PER_CLAIM for a in r.alts):
        return (f"{head}: asks for {min(a.request.count for a in r.alts)} devices, more than "
                f"the {MAX_DEVICES_PER_CLAIM} one claim can hold")
    if all(a.request.mode != ALL and len(a.candidates) < a.request.count for a in r.alts):
        need = min(a.request.count for a in r.alts)
        return (f"{head}: no node offers {_request_phrase(alts)} "
                f"({matching} devices match its class and selectors, {need} needed)")
    if any(a.request.mode == ALL and not a.candidates for a in r.alts) and matching == 0:
        return f"{head}: no device matches class {alts[0].device_class} and its selectors"
    if all(len(a.candidates) > MAX_DEVICES_PER_CLAIM for a in r.alts if a.request.mode == ALL
           ) and any(a.request.mode == ALL for a in r.alts):
        return (f"{head}: allocationMode All matches {matching} devices, more than the "
                f"{MAX_DEVICES_PER_CLAIM} one claim can hold")
    # The search undid its own picks: its sets are the node's allocations before this pod.
    free = [
        sum(1 for pos, i in enumerate(a.candidates) if i not in search.used
            and (a.consume[pos] is not None or i not in search.shared))
        for a in r.alts
    ]
    if all((n < len(a.candidates)) if a.request.mode == ALL else (n < a.request.count)
           for a, n in zip(r.alts, free, strict=True)):
        return (f"{head}: only {max(free)} of the {matching} devices matching "
                f"{_request_phrase(alts)} are free")
    cons = [prep.constraints[k] for k in r.constraints]
    if cons:
        with_ = ", ".join(
            f"{'matching' if c.match else 'distinct'} attribute {c.attribute}" for c in cons
        )
        others = [
            " or ".join(
                f"all {o.name}" if a.request.mode == ALL else f"{a.request.count} {o.name}"
                for a in o.alts
            )
            for o in prep.requests
            if o.claim == r.claim and o.index != r.index and set(o.constraints) & set(r.constraints)
        ]
        together = f" together with {' and '.join(others)}" if others else ""
        return f"{head}: no node offers {_request_phrase(alts)} with {with_}{together}"
    counters = any(prep.inventory.devices[i].consumes for a in r.alts for i in a.candidates)
    if counters:
        return (f"{head}: no node has {_request_phrase(alts)} free "
                f"(in use, or their shared counters are used up)")
    return f"{head}: no node has {_request_phrase(alts)} free (in use or capacity used up)"


def resolve(devices: NodeDevices, claims: Sequence[ClaimShape], pod: PodAllocation) -> PodDevices:
    """A pod's allocation with device, pool and request names (``gpu/small`` for a
    firstAvailable subrequest), like ``status.allocation.devices.results``."""
    pools = devices.pools
    npools = len(pools)
    if len(claims) == 1:
        return (ClaimAllocation(claims[0].name, tuple(
            DeviceResult(req, drv, pools[pi] if pi < npools else "", name, cap, admin)
            for _, req, drv, pi, name, cap, admin in pod.named
        )),)
    by_claim: list[list[DeviceResult]] = [[] for _ in claims]
    for c, req, drv, pi, name, cap, admin in pod.named:
        by_claim[c].append(
            DeviceResult(req, drv, pools[pi] if pi < npools else "", name, cap, admin)
        )
    return tuple(ClaimAllocation(claims[i].name, tuple(res)) for i, res in enumerate(by_claim))


def book(devices: NodeDevices, results: Iterable[DeviceResult]) -> NodeDevices:
    """``devices`` with allocation results (a plan's, or allocated ResourceClaims') in use:
    exclusive devices taken, shared devices' consumed capacity and counters added. Results
    naming devices the node does not have are ignored (the device may be gone)."""
    inv = devices.shape.inventory
    index = {(d.driver, devices.pools[d.pool] if d.pool < len(devices.pools) else "", d.name): i
             for i, d in enumerate(inv.devices)}
    state = devices.shape.state
    used = set(state.used)
    shared = set(state.shared)
    cap: dict[int, dict[str, int]] = {d: dict(v) for d, v in state.capacity}
    counters: dict[CounterKey, dict[str, int]] = {k: dict(v) for k, v in state.counters}
    for r in results:
        i = index.get((r.driver, r.pool, r.device))
        if i is None or r.admin_access:
            continue  # gone, or held for administration without excluding others
        dev = inv.devices[i]
        if dev.allow_multiple:
            shared.add(i)
            slot = cap.setdefault(i, {})
            for name, amount in (r.consumed_capacity or dev.capacity).items():
                slot[name] = slot.get(name, 0) + amount
        else:
            used.add(i)
        for use in dev.consumes:
            cslot = counters.setdefault((dev.driver, dev.pool, use.counter_set), {})
            for name, amount in use.counters.items():
                cslot[name] = cslot.get(name, 0) + amount
    new = DeviceState(
        used=frozenset(used),
        counters=tuple(sorted((k, tuple(sorted((n, a) for n, a in v.items() if a)))
                              for k, v in counters.items() if any(v.values()))),
        capacity=tuple(sorted((d, tuple(sorted((n, a) for n, a in v.items() if a)))
                              for d, v in cap.items())),
        shared=frozenset(shared),
    )
    return with_state(devices, new)


def emptied(devices: NodeDevices) -> NodeDevices:
    """``devices`` with nothing allocated (the best the node could ever offer)."""
    if devices.shape.state == EMPTY_STATE:
        return devices
    return with_state(devices, EMPTY_STATE)


def with_state(devices: NodeDevices, state: DeviceState) -> NodeDevices:
    """``devices`` after allocations (a new shape object: shapes are shared by nodes)."""
    return NodeDevices(DeviceShape(devices.shape.inventory, state), devices.pools,
                       devices.identity)
