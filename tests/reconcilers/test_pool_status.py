"""CapacityPool status: the pure figures, the bounded writer, the pool's conditions, and the
decision log lines (sandbox tier; e2e/test_visibility.py runs the user's view on both tiers)."""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller.api.capacitypool import CapacityPool
from controller.commands import objects
from controller.commands.run import _JsonFormatter
from controller.common.clock import ManualClock
from controller.common.decision_log import log_decision
from controller.common.topology_defaults import DEFAULT_LEVELS, POOL_LABEL
from controller.kube import KubeClient
from controller.kube.resources import CAPACITY_POOLS, NODES, PROVISIONING_REQUESTS
from controller.operator import Controller
from controller.reconcilers.pool_status import merge_patch
from controller.state.bookings import Booking
from controller.state.cache import ClusterState
from controller.state.pool_figures import PoolFacts, ProviderHealth, Shortage, pool_status
from providers.fake import FakeProvider
from tests.cluster_objects import gpu_node, plan_on, starve
from tests.helpers import eventually

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
_until = functools.partial(eventually, within=10.0, step=0.02)


def _pool_body(**kwargs: Any) -> dict[str, Any]:
    body = objects.gpu_pool("p", blocks=1, racks_per_block=2, nodes_per_rack=4, max_nodes=6,
                            **kwargs)
    body["metadata"]["generation"] = 3
    return body


def _facts(state: ClusterState, *, shortages: list[Shortage] | None = None,
           provider: ProviderHealth | None = None) -> PoolFacts:
    snap = state.snapshot(now=NOW)
    pool = state.pool_registry.pools()["p"]
    nodes = [n for n in snap.nodes if n.pool == "p"]
    return PoolFacts(
        name="p", pool=pool, errors=state.pool_registry.pool_errors("p"),
        state=next(p for p in snap.pools if p.name == "p"), nodes=nodes,
        ready=frozenset(n.name for n in nodes if state.objects.node_ready(n.name)),
        booked=state.booked_nodes(), shortages=shortages or [], provider=provider,
        levels=DEFAULT_LEVELS, generation=3,
    )


def test_figures_per_domain_come_from_the_planning_snapshot() -> None:
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([_pool_body()])
    nodes = [gpu_node(f"n{i}", rack="b1-r1", **{POOL_LABEL: "p"}) for i in range(3)]
    nodes[2]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    state.replace_nodes(nodes)
    # n0 is booked by a request that also waits for one new node in b1-r2.
    booking = Booking(plan=plan_on(["n0"], new=1, pool="p", rack="b1-r2"), attempt=1, groups=())
    state.ledger.reserve("ns/a", booking)

    status = pool_status(_facts(state, provider=ProviderHealth("kind", "list")), NOW)

    r1, r2 = status["domains"]
    assert (r1["name"], r1["nodes"], r1["readyNodes"], r1["bookedNodes"]) == (
        "b1/b1-r1", 3, 2, 1)
    # Booked GPUs are not free: n1's 8 are; n0's are booked; NotReady n2 counts for nothing.
    assert r1["free"]["nvidia.com/gpu"] == "8" and r1["freeNodes"] == 1
    # Pool-wide maxNodes 6: 3 nodes exist and 1 is booked in flight, so 2 more at most.
    assert r1["provisionableNodes"] == 1  # rack limit 4 - 3 existing
    assert r1["provisionable"] == {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"}
    assert (r2["nodes"], r2["inFlightNodes"], r2["provisionableNodes"]) == (0, 1, 2)
    assert r2["availableNodes"] == 2 and r1["availableNodes"] == 2
    assert (status["nodes"], status["readyNodes"], status["bookedNodes"],
            status["inFlightNodes"], status["provisionableNodes"], status["freeGPUs"]) == (
        3, 2, 1, 1, 2, 8)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Valid"]["status"] == "True"
    assert conditions["ProviderReady"]["status"] == "True"
    assert conditions["StockOut"]["status"] == "False"
    assert all(c["observedGeneration"] == 3 for c in conditions.values())
    # The CRD's schema (the model) accepts exactly this object.
    CapacityPool.model_validate({**_pool_body(), "status": status})


def test_stock_outs_provider_errors_and_transition_times() -> None:
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([_pool_body()])
    until = NOW + timedelta(minutes=5)
    state.mark_short("p", {objects.BLOCK: "b1", objects.RACK: "b1-r2"}, available=1,
                     until=until)
    shortages = [Shortage(d, a, u) for d, a, u in state.pool_registry.shortages(NOW)["p"]]
    failing = ProviderHealth("kind", "acquire", "throttled", "ProviderUnavailable")
    first = pool_status(_facts(state, shortages=shortages, provider=failing), NOW)

    r2 = first["domains"][1]
    assert r2["provisionableNodes"] == 1  # capped by the stock the provider reported
    assert (r2["stockOutUntil"], r2["stockOutNodes"]) == ("2026-11-30T12:05:00Z", 1)
    conditions = {c["type"]: c for c in first["conditions"]}
    assert conditions["StockOut"]["status"] == "True"
    assert "b1/b1-r2 (at most 1 new node(s) until 2026-11-30T12:05:00Z)" in \
        conditions["StockOut"]["message"]
    assert (conditions["ProviderReady"]["status"], conditions["ProviderReady"]["reason"]) == (
        "False", "ProviderUnavailable")
    assert "throttled" in conditions["ProviderReady"]["message"]

    # Later, nothing flipped: the transition times stay; a flip moves only its own.
    later = NOW + timedelta(minutes=1)
    again = _facts(state, shortages=shortages, provider=ProviderHealth("kind", "list"))
    facts = replace(again, previous=first["conditions"])
    second = {c["type"]: c for c in pool_status(facts, later)["conditions"]}
    assert second["StockOut"]["lastTransitionTime"] == "2026-11-30T12:00:00Z"
    assert second["ProviderReady"]["lastTransitionTime"] == "2026-11-30T12:01:00Z"


def test_every_validation_error_is_listed_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = _pool_body()
    bad["spec"]["minNodes"] = 50
    bad["spec"]["nodeTemplate"]["allocatable"]["cpu"] = "lots"
    bad["spec"]["nodeTemplate"]["allocatable"]["memory"] = "1Zz"
    state = ClusterState(levels=DEFAULT_LEVELS)
    with caplog.at_level(logging.WARNING, logger="controller.state.pool_registry"):
        for _ in range(3):  # every status write or finalizer patch brings the pool back
            state.upsert_pool(bad)
        state.replace_pools([bad])  # a re-list
    warned = [r for r in caplog.records if "invalid CapacityPool" in r.getMessage()]
    assert len(warned) == 1
    errors = state.pool_registry.pool_errors("p")
    assert len(errors) == 3, errors
    status = pool_status(PoolFacts(name="p", pool=None, errors=errors), NOW)
    valid = status["conditions"][0]
    assert (valid["type"], valid["status"], valid["reason"]) == ("Valid", "False", "Invalid")
    assert valid["message"].startswith("3 problem(s)")
    for part in ("minNodes (50) exceeds maxNodes (6)",
                 "spec.nodeTemplate.allocatable.cpu: invalid quantity 'lots'",
                 "spec.nodeTemplate.allocatable.memory: invalid quantity '1Zz'"):
        assert part in valid["message"]


def test_merge_patch_removes_what_the_status_no_longer_has() -> None:
    current = {"free": {"cpu": "8", "nvidia.com/gpu": "8"}, "domains": [{"a": 1}], "old": 1}
    desired = {"free": {"cpu": "4"}, "domains": []}
    assert merge_patch(current, desired) == {
        "free": {"cpu": "4", "nvidia.com/gpu": None}, "domains": [], "old": None}


async def test_the_writer_writes_only_changes_and_at_most_its_budget(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, _, _ = running
    writer = controller.pool_status
    for i in range(4):
        await kube.create(CAPACITY_POOLS, objects.gpu_pool(f"extra-{i}", blocks=1))
    await _until(lambda: _has_pools(controller, 5))
    # Defaults: 2 writes/s x 10 s interval = at most 20 per pass; with a budget of 2, five
    # new pools take three passes, the longest-waiting first.
    controller.pool_status.config = controller.config.pool_status.model_copy(
        update={"max_writes_per_second": 0.2})
    assert writer.budget == 2
    assert [await writer.write_changed() for _ in range(4)] == [2, 2, 1, 0]

    # Node heartbeats change nothing the status shows: no write.
    await kube.create(NODES, gpu_node("hb", **{POOL_LABEL: "gpu"}))
    await _until(lambda: _seen(controller, "hb"))
    assert await writer.write_changed() == 1  # a node joined the pool: that is a change
    for beat in range(3):
        patched = await kube.patch_status(NODES, "hb", {"conditions": [
            {"type": "Ready", "status": "True",
             "lastHeartbeatTime": f"2026-11-30T12:00:0{beat}Z"}]})
        rv = patched["metadata"]["resourceVersion"]
        await _until(lambda rv=rv: _version_seen(controller, "hb", rv))
        assert await writer.write_changed() == 0
    status = (await kube.get(CAPACITY_POOLS, "gpu"))["status"]
    assert status["nodes"] == 1 and status["readyNodes"] == 1


async def _seen(controller: Controller, node: str) -> bool:
    return controller.state.objects.node_exists(node)


async def _version_seen(controller: Controller, node: str, rv: str) -> bool:
    # The cache keeps no heartbeat times (nothing reads them): the node's version says
    # the heartbeat arrived.
    found = controller.state.objects.node(node)
    return found is not None and found.metadata.resource_version == rv


async def _has_pools(controller: Controller, n: int) -> bool:
    return len(controller.state.pool_registry.pools()) >= n


async def test_a_stock_out_shows_on_the_pool_until_the_backoff_ends(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, clock, provider = running
    starve(provider)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "starved", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")
    await _until(lambda: _acquired(provider))
    await _until(lambda: _short(controller))
    await controller.pool_status.write_changed()
    status = (await kube.get(CAPACITY_POOLS, "gpu"))["status"]
    stock = {c["type"]: c for c in status["conditions"]}["StockOut"]
    assert stock["status"] == "True"
    short = [d for d in status["domains"] if "stockOutUntil" in d]
    assert len(short) == 1 and short[0]["provisionableNodes"] == 0
    assert short[0]["name"] in stock["message"]
    # Once the backoff is over, the stock-out is too, and the pool says so (the request is
    # gone first: its retry would run out of stock again).
    await kube.delete(PROVISIONING_REQUESTS, "starved", namespace="ns")
    await _until(lambda: _gone(kube, "starved"))
    await clock.advance(controller.config.retry.max_backoff_seconds + 1)
    await controller.pool_status.write_changed()
    status = (await kube.get(CAPACITY_POOLS, "gpu"))["status"]
    assert {c["type"]: c for c in status["conditions"]}["StockOut"]["status"] == "False"


async def _acquired(provider: FakeProvider) -> bool:
    return any(c.op == "acquire" for c in provider.calls)


async def _short(controller: Controller) -> bool:
    return bool(controller.state.pool_registry.shortages(controller.clock.now()))


def test_a_decision_is_one_json_line_with_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="muster.decisions"):
        log_decision("plan", "ns/train", outcome="fits", new_nodes=4, groups=["gpu[rack=b1-r1]x4"])
    (record,) = caplog.records
    line = json.loads(_JsonFormatter().format(record))
    assert (line["decision"], line["request"], line["outcome"], line["new_nodes"]) == (
        "plan", "ns/train", "fits", 4)
    assert line["groups"] == ["gpu[rack=b1-r1]x4"]
    assert record.getMessage() == ("decision=plan request=ns/train outcome=fits new_nodes=4 "
                                   'groups=["gpu[rack=b1-r1]x4"]')
    with pytest.raises(ValueError):
        log_decision("guess", "ns/x")


async def test_each_decision_of_a_gang_is_logged_once(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="muster.decisions"):
        await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
            "gang", namespace="ns", pod_sets=[("workers", 3)]), namespace="ns")
        await _until(lambda: _provisioned(kube, "gang"))
        await kube.delete(PROVISIONING_REQUESTS, "gang", namespace="ns")
        await _until(lambda: _gone(kube, "gang"))
    lines = [r.__dict__["muster_fields"] for r in caplog.records
             if r.name == "muster.decisions"]
    kinds = [(f["decision"], f.get("outcome")) for f in lines]
    assert kinds == [("plan", "fits"), ("acquire", "acquired"), ("release", "released")], kinds
    plan, acquire, release = lines
    assert plan["request"] == acquire["request"] == release["request"] == "ns/gang"
    assert plan["new_nodes"] == 3 and len(acquire["nodes"]) == 3 and release["nodes"] == 3


async def _provisioned(kube: KubeClient, name: str) -> bool:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return any(c["type"] == "Provisioned" and c["status"] == "True"
               for c in (pr.get("status") or {}).get("conditions") or [])


async def _gone(kube: KubeClient, name: str) -> bool:
    return await kube.get_or_none(PROVISIONING_REQUESTS, name, namespace="ns") is None


def test_free_dra_devices_are_counted_by_device_class() -> None:
    from controller.inputs.dra_templates import nvidia_gpu_node
    from controller.reconcilers.pool_status import one_device_claims
    from tests.dra_world import CLASSES, dra_node, pool_doc

    state = ClusterState(levels=DEFAULT_LEVELS)
    slices = nvidia_gpu_node(gpus=8, nics=4)
    state.replace_pools([pool_doc("p", slices)])
    docs = dra_node("n1", slices, labels={POOL_LABEL: "p"})
    state.replace_nodes([d for d in docs if d["kind"] == "Node"])
    state.dra.replace("resourceslices", [d for d in docs if d["kind"] == "ResourceSlice"])
    state.dra.replace("deviceclasses", CLASSES)
    snap = state.snapshot(now=NOW)
    facts = PoolFacts(
        name="p", pool=state.pool_registry.pools()["p"], state=snap.pools[0], nodes=snap.nodes,
        ready=frozenset({"n1"}), levels=DEFAULT_LEVELS,
        device_classes=one_device_claims(state.dra.catalog()),
    )
    (row,) = pool_status(facts, NOW)["domains"]
    # No MIG device in the template: that class is not the pool's to report.
    assert row["freeDevices"] == {"any": 12, "gpu.nvidia.com": 8, "nic": 4}


def test_a_pool_its_provider_refuses_leaves_planning() -> None:
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([_pool_body()])
    assert [p.name for p in state.snapshot(now=NOW).pools] == ["p"]
    state.set_pool_unusable("p", ["spec.parameters: defaultStock must be >= 0"])
    assert state.snapshot(now=NOW).pools == ()
    state.set_pool_unusable("p", [])
    assert [p.name for p in state.snapshot(now=NOW).pools] == ["p"]


async def test_an_api_server_away_is_one_warning_line_per_interval_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio

    from controller.config import PoolStatusConfig
    from controller.kube import ApiError
    from controller.reconcilers.pool_status import PoolStatusWriter

    class Clock:
        passes = 0

        async def sleep(self, seconds: float) -> None:
            self.passes += 1
            if self.passes > 4:
                raise asyncio.CancelledError

    # Only run() is exercised: its pass (write_changed) is replaced below.
    writer = PoolStatusWriter(kube=None, state=None, providers=None,  # type: ignore[arg-type]
                              config=PoolStatusConfig(), clock=Clock())  # type: ignore[arg-type]

    async def away() -> None:
        raise ApiError(0, "ClientConnectorError", "Cannot connect to host 127.0.0.1:6443")

    writer.write_changed = away  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger="controller.reconcilers.pool_status")
    with pytest.raises(asyncio.CancelledError):
        await writer.run()
    lines = [r for r in caplog.records if r.name == "controller.reconcilers.pool_status"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].exc_info is None
    assert "no answer ClientConnectorError" in lines[0].getMessage()


async def test_reservation_figures_are_read_on_a_bounded_cadence_and_kept_on_errors() -> None:
    from controller.api.capacitypool import CapacityPoolStatus
    from controller.config import PoolStatusConfig
    from controller.reconcilers.pool_status import PoolStatusWriter
    from providers.base import TransientProviderError
    from providers.common import ReservationFigures

    class Provider:
        reads = 0
        fail = False

        async def reservations(self, pool: CapacityPool) -> list[ReservationFigures]:
            self.reads += 1
            if self.fail:
                raise TransientProviderError("DescribeCapacityReservations: throttled")
            return [ReservationFigures(id="cr-0abc", zone="us-east-1a", reserved=16,
                                       free=16 - self.reads, state="active",
                                       end=NOW + timedelta(days=7))]

    class Providers:
        provider = Provider()

        def for_pool(self, pool: CapacityPool) -> Provider:
            return self.provider

    clock = ManualClock(NOW)
    providers = Providers()
    cache = ClusterState(levels=DEFAULT_LEVELS)
    cache.replace_pools([_pool_body()])
    writer = PoolStatusWriter(kube=None, state=cache, providers=providers,  # type: ignore[arg-type]
                              config=PoolStatusConfig(reservation_refresh_seconds=60),
                              clock=clock)
    pool = CapacityPool.model_validate(_pool_body())
    first = await writer._reservation_rows(pool, ())
    assert first == [{"id": "cr-0abc", "zone": "us-east-1a", "reserved": 16, "used": 1,
                      "free": 15, "state": "active", "end": "2026-12-07T12:00:00Z",
                      "observedAt": "2026-11-30T12:00:00Z"}]
    await clock.advance(59)
    assert await writer._reservation_rows(pool, ()) == first and providers.provider.reads == 1
    await clock.advance(1)
    assert (await writer._reservation_rows(pool, ()))[0]["used"] == 2
    # The planner adds at most what the reservation still holds (14 of the pool's 6: 6).
    [planned] = cache.snapshot(now=clock.now()).pools
    assert planned.max_new_nodes == 6
    providers.provider.fail = True
    await clock.advance(60)
    kept = await writer._reservation_rows(pool, ())
    assert kept[0]["used"] == 2 and providers.provider.reads == 3
    # A pool with errors is not read at all.
    await clock.advance(60)
    await writer._reservation_rows(pool, ("spec.parameters: bad",))
    assert providers.provider.reads == 3

    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([_pool_body()])
    facts = replace(_facts(state), reservations=kept)
    status = pool_status(facts, NOW)
    assert status["reservations"] == kept
    assert CapacityPoolStatus.model_validate(status).reservations[0].free == 14
    assert "reservations" not in pool_status(_facts(state), NOW)


def test_a_reservation_caps_what_is_planned_into_the_pool_and_only_inside_its_window() -> None:
    from controller.state.pool_registry import ReservedCapacity

    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([_pool_body()])
    [pool] = state.snapshot(now=NOW).pools
    assert pool.max_new_nodes == 6 and not pool.reserved
    start, end = NOW + timedelta(hours=1), NOW + timedelta(days=7)
    state.set_pool_reservation("p", [ReservedCapacity("", 3, start=start, end=end)])
    assert state.snapshot(now=NOW).pools[0].max_new_nodes == 0  # the block has not begun
    [inside] = state.snapshot(now=start).pools
    assert inside.max_new_nodes == 3 and inside.reserved
    assert max(d.max_new_nodes for d in inside.domains) == 3
    assert state.snapshot(now=end).pools[0].max_new_nodes == 0  # it has ended
    # How long the block still holds a run is the fit engine's per-request input.
    assert inside.open_seconds == (end - start).total_seconds()
    state.set_pool_reservation("p", None)
    assert state.snapshot(now=end).pools[0].max_new_nodes == 6
    assert state.snapshot(now=end).pools[0].open_seconds is None


def _zoned_pool(name: str = "p") -> dict[str, Any]:
    body = objects.gpu_pool(name, blocks=1, racks_per_block=1, nodes_per_rack=4, max_nodes=8)
    body["spec"]["topology"] = {"level": "topology.kubernetes.io/zone", "maxNodesPerDomain": 4,
                                "domains": [{"labels": {"topology.kubernetes.io/zone": z}}
                                            for z in ("us-east-1a", "us-east-1b")]}
    return body


def test_a_reservation_caps_only_the_domains_of_its_zone() -> None:
    from controller.state.pool_registry import ReservedCapacity

    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([_zoned_pool()])
    state.set_pool_reservation("p", [ReservedCapacity("us-east-1a", 2)])
    [pool] = state.snapshot(now=NOW).pools
    caps = {d.labels["topology.kubernetes.io/zone"]: d.max_new_nodes for d in pool.domains}
    assert caps == {"us-east-1a": 2, "us-east-1b": 0} and pool.max_new_nodes == 2


def test_nodes_registered_since_the_read_are_not_booked_twice() -> None:
    from controller.state.pool_registry import ReservedCapacity

    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([_pool_body()])
    state.set_pool_reservation("p", [ReservedCapacity("", 4)])
    assert state.snapshot(now=NOW).pools[0].max_new_nodes == 4
    # Two of the reservation's instances registered before the cloud is read again: its
    # figures (read before them) still call them free, the planner does not.
    state.replace_nodes([gpu_node(f"n{i}", rack="b1-r1", **{POOL_LABEL: "p"})
                         for i in range(2)])
    assert state.snapshot(now=NOW).pools[0].max_new_nodes == 2
    # The next read counts them itself.
    state.set_pool_reservation("p", [ReservedCapacity("", 2, reserved=4)])
    [pool] = state.snapshot(now=NOW).pools
    assert pool.max_new_nodes == 2 and pool.reserved_busy == 0
    # Others run 1 of the 2 left: busy now, not gone (NeverFits counts it back).
    state.set_pool_reservation("p", [ReservedCapacity("", 1, reserved=4)])
    [pool] = state.snapshot(now=NOW).pools
    assert (pool.max_new_nodes, pool.reserved_busy) == (1, 1)


def test_a_reservation_caps_a_pool_without_declared_zones_at_its_free_count() -> None:
    """A pool whose zone the cloud picks (no declared domains: a placeholder zone) can use
    its reservation: the provider launches into the reservation's own zone."""
    from controller.common.topology_defaults import placeholder
    from controller.state.pool_registry import ReservedCapacity

    body = _zoned_pool()
    del body["spec"]["topology"]["domains"]
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([body])
    state.set_pool_reservation("p", [ReservedCapacity("us-east-1a", 2)])
    [pool] = state.snapshot(now=NOW).pools
    zones = [d.labels.get("topology.kubernetes.io/zone", "") for d in pool.domains]
    assert zones and all(placeholder(z) for z in zones)
    assert pool.max_new_nodes == 2 and max(d.max_new_nodes for d in pool.domains) == 2
