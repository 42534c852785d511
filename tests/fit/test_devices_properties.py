"""Property: every per-node device allocation the engine produces respects exclusivity,
shared capacity, counters, selectors and constraints, in one node's search and across the
whole plan of a gang; and when a search stops, an exhaustive search agrees that one more
pod's claim cannot be allocated."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations, product

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.fit import (
    GangRequest,
    Mode,
    NodeState,
    Plan,
    PodSetRequest,
    PodShape,
    Snapshot,
    plan,
)
from controller.fit.cel import compile_selector
from controller.fit.devices import ClaimFitter, consumed_amount, resolve
from controller.fit.dra_types import (
    ClaimRequest,
    ClaimShape,
    CounterUse,
    Device,
    DeviceConstraint,
    DeviceInventory,
    DeviceRequest,
    DeviceResult,
    DeviceShape,
    NodeDevices,
)

D = "x.io"
KINDS = ("a", "b")


@st.composite
def devices(draw: st.DrawFn) -> NodeDevices:
    n = draw(st.integers(1, 6))
    counter_total = draw(st.integers(1, 4))
    devs = []
    for i in range(n):
        shared = draw(st.booleans()) and draw(st.booleans())  # about one in four
        consumes = (CounterUse("cs", {"c": draw(st.integers(1, 2))}),) if draw(
            st.booleans()) else ()
        devs.append(Device(
            name=f"d{i}", driver=D, pool=0,
            attributes={f"{D}/kind": draw(st.sampled_from(KINDS)),
                        f"{D}/root": draw(st.sampled_from(("r0", "r1", "r2")))},
            capacity={f"{D}/mem": draw(st.sampled_from((4, 8)))},
            consumes=consumes, allow_multiple=shared,
        ))
    inv = DeviceInventory(tuple(devs), {(D, 0, "cs"): {"c": counter_total}})
    return NodeDevices(DeviceShape(inv), ("node-pool",))


@st.composite
def claims(draw: st.DrawFn) -> ClaimShape:
    requests = []
    for name in draw(st.sampled_from((("a",), ("a", "b"), ("b",)))):
        kind = draw(st.sampled_from(KINDS))
        sel = compile_selector(f'device.attributes["{D}"].kind == "{kind}"',
                               f"DeviceClass cls-{kind}")
        mem = draw(st.sampled_from((None, 2, 4)))
        requests.append(ClaimRequest(name, (DeviceRequest(
            name, f"cls-{kind}", (sel,), count=draw(st.integers(1, 2)),
            capacity={"mem": mem} if mem else {},
        ),)))
    constraints = []
    kind = draw(st.sampled_from(("none", "match", "distinct")))
    if kind != "none":
        names = tuple(r.name for r in requests)
        attr = f"{D}/root"
        constraints.append(DeviceConstraint(
            names, attr if kind == "match" else None, attr if kind == "distinct" else None))
    return ClaimShape("c", "ResourceClaimTemplate ns/t", tuple(requests), tuple(constraints))


def _consumed(dev: Device, req: DeviceRequest) -> dict[str, int]:
    out = {}
    for name, total in dev.capacity.items():
        asked = req.capacity.get(name.split("/", 1)[1])
        got = consumed_amount(asked, total, None)
        assert got is not None
        out[name] = got
    return out


class Ledger:
    """What is in use on the node, computed from results alone (independent of the
    engine's own state)."""

    def __init__(self, inv: DeviceInventory) -> None:
        self.inv = inv
        self.by_name = {d.name: d for d in inv.devices}
        self.exclusive: set[str] = set()
        self.shared_mem: dict[str, int] = {}
        self.counter = 0

    def ok(self, picks: list[tuple[Device, DeviceRequest]]) -> bool:
        exclusive = set(self.exclusive)
        mem = dict(self.shared_mem)
        counter = self.counter
        for dev, req in picks:
            if dev.name in exclusive:
                return False
            if dev.allow_multiple:
                for name, amount in _consumed(dev, req).items():
                    mem[dev.name] = mem.get(dev.name, 0) + amount
                    if mem[dev.name] > dev.capacity[name]:
                        return False
            else:
                if dev.name in mem:
                    return False
                if any(dev.capacity.get(f"{D}/{n}", 0) < v for n, v in req.capacity.items()):
                    return False
                exclusive.add(dev.name)
            counter += sum(c.counters["c"] for c in dev.consumes)
        return counter <= self.inv.counters[(D, 0, "cs")]["c"]

    def add(self, picks: list[tuple[Device, DeviceRequest]]) -> None:
        assert self.ok(picks)
        for dev, req in picks:
            if dev.allow_multiple:
                for amount in _consumed(dev, req).values():
                    self.shared_mem[dev.name] = self.shared_mem.get(dev.name, 0) + amount
            else:
                self.exclusive.add(dev.name)
            self.counter += sum(c.counters["c"] for c in dev.consumes)


def _constraints_hold(claim: ClaimShape, picks: list[tuple[str, Device]]) -> bool:
    for con in claim.constraints:
        attr = con.match_attribute or con.distinct_attribute
        assert attr is not None
        values = [d.attributes[attr] for r, d in picks if r in con.requests]
        if con.match_attribute and len(set(values)) > 1:
            return False
        if con.distinct_attribute and len(set(values)) != len(values):
            return False
    return True


def _selected(req: DeviceRequest, dev: Device) -> bool:
    return dev.attributes[f"{D}/kind"] == req.device_class.removeprefix("cls-")


def _candidate_sets(claim: ClaimShape, inv: DeviceInventory
                    ) -> Iterator[list[tuple[str, Device, DeviceRequest]]]:
    per_request = []
    for r in claim.requests:
        req = r.alternatives[0]
        matching = [d for d in inv.devices if _selected(req, d)]
        per_request.append([[(r.name, d, req) for d in combo]
                            for combo in combinations(matching, req.count)])
    for choice in product(*per_request):
        yield [p for group in choice for p in group]


def _by_name(results: tuple[DeviceResult, ...], ledger: Ledger, claim: ClaimShape
             ) -> list[tuple[str, Device, DeviceRequest]]:
    reqs = {r.name: r.alternatives[0] for r in claim.requests}
    return [(r.request, ledger.by_name[r.device], reqs[r.request]) for r in results]


@settings(max_examples=150, deadline=None)
@given(devices(), claims())
def test_allocations_respect_devices_and_constraints(node: NodeDevices, claim: ClaimShape
                                                    ) -> None:
    fitter = ClaimFitter((claim,))
    run = fitter.run(node, 12)
    ledger = Ledger(node.shape.inventory)
    for pod in run.pods:
        (alloc,) = resolve(node, (claim,), pod)
        assert alloc.claim == "c"
        picks = _by_name(alloc.results, ledger, claim)
        # Each request got exactly its count of devices that its class selects.
        for r in claim.requests:
            mine = [d for name, d, _ in picks if name == r.name]
            assert len(mine) == r.alternatives[0].count
            assert all(_selected(r.alternatives[0], d) for d in mine)
        # No device twice within one pod unless it is shared.
        names = [d.name for _, d, _ in picks if not d.allow_multiple]
        assert len(names) == len(set(names))
        assert _constraints_hold(claim, [(n, d) for n, d, _ in picks])
        assert all(r.pool == "node-pool" for r in alloc.results)
        ledger.add([(d, req) for _, d, req in picks])  # exclusivity, capacity, counters
    if run.failure is not None:
        # Stopped because one more pod does not fit: nothing the exhaustive search finds.
        for cand in _candidate_sets(claim, node.shape.inventory):
            names = [d.name for _, d, _ in cand if not d.allow_multiple]
            if len(names) != len(set(names)):
                continue
            assert not (_constraints_hold(claim, [(n, d) for n, d, _ in cand])
                        and ledger.ok([(d, req) for _, d, req in cand])), (
                f"engine stopped at {len(run.pods)} pods but {cand} still fits")




@st.composite
def clusters(draw: st.DrawFn) -> list[NodeState]:
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        devs = draw(devices())
        devs = NodeDevices(devs.shape, (f"pool-{i}",))
        nodes.append(NodeState(f"n{i}", {"kubernetes.io/hostname": f"n{i}"}, (),
                               {"cpu": 8000, "pods": 110},
                               {"cpu": draw(st.sampled_from((2000, 8000))), "pods": 110},
                               devices=devs))
    return nodes


@settings(max_examples=60, deadline=None)
@given(clusters(), st.lists(st.tuples(claims(), st.integers(1, 4)), min_size=1, max_size=2))
def test_plans_never_overcommit_devices(nodes: list[NodeState],
                                        pod_sets: list[tuple[ClaimShape, int]]) -> None:
    gang = GangRequest("ns/g", tuple(
        PodSetRequest(f"s{i}", count, PodShape({"cpu": 1000, "pods": 1}, claims=(claim,)))
        for i, (claim, count) in enumerate(pod_sets)))
    got = plan(gang, Snapshot(tuple(nodes), (), ("kubernetes.io/hostname",)), Mode.CHECK)
    if not isinstance(got, Plan):
        return
    ledgers = {n.name: Ledger(n.devices.shape.inventory) for n in nodes if n.devices}
    claims_of = {f"s{i}": claim for i, (claim, _) in enumerate(pod_sets)}
    placed: dict[str, int] = {}
    for a in got.assignments:
        assert a.node is not None and len(a.devices) == a.pods
        placed[a.pod_set] = placed.get(a.pod_set, 0) + a.pods
        claim = claims_of[a.pod_set]
        ledger = ledgers[a.node]
        for pod in a.devices:
            (alloc,) = pod
            assert {r.pool for r in alloc.results} <= {f"pool-{a.node[1:]}"}
            picks = _by_name(alloc.results, ledger, claim)
            for r in claim.requests:
                assert len([1 for n, _, _ in picks if n == r.name]) == \
                    r.alternatives[0].count
            assert _constraints_hold(claim, [(n, d) for n, d, _ in picks])
            assert ledger.ok([(d, req) for _, d, req in picks])
            ledger.add([(d, req) for _, d, req in picks])
    assert placed == {f"s{i}": count for i, (_, count) in enumerate(pod_sets)}
