"""Topology relaxation (controller/inputs/relaxation.py): a gang that waited its
``relaxTopologyAfter`` for the one rack ``muster.dev/required-topology`` asks for takes the
most compact placement it can get, and says so."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import pytest

from controller.api.capacitypool import CapacityPool
from controller.api.parameters import read_parameters
from controller.commands import objects
from controller.common.clock import ManualClock
from controller.common.topology_defaults import DEFAULT_LEVELS, KUEUE_REQUIRED, MUSTER_REQUIRED
from controller.config import MusterConfig
from controller.fit.types import Mode, TopologyMode
from controller.inputs.relaxation import (
    RELAX_ANNOTATION,
    RELAXED_DETAIL,
    alternatives,
    pools_default,
    relax_after,
    relaxable,
)
from controller.kube import KubeClient
from controller.kube.resources import CAPACITY_POOLS, PROVISIONING_REQUESTS
from controller.operator import Controller
from providers.fake import FakeProvider
from tests.cluster_objects import gang
from tests.helpers import eventually

_until = functools.partial(eventually, within=10.0, step=0.02)
RACKS = {f"b{b}-r{r}": 2 for b in (1, 2) for r in range(1, 5)}
"""Every rack of the "gpu" pool may hold 2 nodes: no rack ever holds a 4-node gang."""


async def _small_racks(kube: KubeClient, controller: Controller) -> None:
    domains = objects.gpu_pool("gpu", rack_limits=RACKS)["spec"]["topology"]["domains"]
    await kube.merge_patch(CAPACITY_POOLS, "gpu", {"spec": {"topology": {"domains": domains}}})

    async def applied() -> bool:
        pool = controller.state.pool_registry.pools().get("gpu")
        return pool is not None and all(d.max_nodes == 2 for d in pool.spec.topology.domains)

    await _until(applied)


async def _request(
    kube: KubeClient,
    name: str,
    *,
    parameters: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    workers: int = 4,
) -> None:
    body = objects.provisioning_request(
        name, namespace="ns", pod_sets=[("workers", workers)], parameters=parameters
    )
    if annotations:
        body["metadata"]["annotations"] = annotations
    await kube.create(PROVISIONING_REQUESTS, body, namespace="ns")


async def _status(kube: KubeClient, name: str) -> dict[str, Any]:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return dict(pr.get("status") or {})


def _cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


async def test_a_gang_no_rack_holds_waits_then_takes_one_block(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, clock, _ = running
    await _small_racks(kube, controller)
    await _request(kube, "relaxing", parameters={"relaxTopologyAfter": "2m"})

    async def waiting() -> dict[str, Any]:
        cond = _cond(await _status(kube, "relaxing"), "Provisioned")
        return cond if cond.get("reason") == "CapacityIsNotFound" else {}

    cond = await _until(waiting)
    assert "relaxes its topology at" in cond["message"], cond
    assert not _cond(await _status(kube, "relaxing"), "Failed")

    async def provisioned() -> dict[str, Any]:
        await clock.advance(10)
        status = await _status(kube, "relaxing")
        return status if _cond(status, "Provisioned").get("status") == "True" else {}

    status = await _until(provisioned)
    message = _cond(status, "Provisioned")["message"]
    assert "Topology relaxed after waiting 1" in message, message
    assert "pod set workers in one block b" in message, message
    details = status["provisioningClassDetails"]
    assert details[RELAXED_DETAIL].startswith("workers=one block b"), details
    assert details["muster.dev/topology-level"] == objects.BLOCK
    # Two racks of one block, 2 nodes each.
    record = controller.state.objects.request("ns/relaxing")
    assert record is not None and record.booking is not None, "the request holds a booking"
    groups = record.booking.groups
    assert sorted(g.count for g in groups) == [2, 2]
    assert len({g.domain[objects.BLOCK] for g in groups}) == 1


@pytest.mark.parametrize("how", ["default", "never"])
async def test_without_a_policy_or_with_never_the_placement_stays_strict(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider], how: str
) -> None:
    controller, clock, _ = running
    await _small_racks(kube, controller)
    params = {"relaxTopologyAfter": "never"} if how == "never" else None
    await _request(kube, "strict", parameters=params)

    async def failed() -> dict[str, Any]:
        await clock.advance(1)  # past the wait for pools created with the request
        return _cond(await _status(kube, "strict"), "Failed")

    assert (await _until(failed))["reason"] == "CapacityNeverFits"


@pytest.mark.parametrize(
    "muster_config", [MusterConfig(topology={"relax_after_seconds": 0})], ids=["relax-at-once"]
)
async def test_the_configured_default_applies_and_the_annotation_overrides_it(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, clock, _ = running
    await _small_racks(kube, controller)
    await _request(kube, "default")
    await _request(kube, "annotated", annotations={RELAX_ANNOTATION: "never"})

    async def outcome() -> tuple[str, str] | None:
        await clock.advance(1)
        a = _cond(await _status(kube, "default"), "Provisioned")
        b = _cond(await _status(kube, "annotated"), "Failed")
        if a.get("status") == "True" and b:
            return a["reason"], b["reason"]
        return None

    assert await _until(outcome) == ("CapacityIsProvisioned", "CapacityNeverFits")


async def _pool_waits(kube: KubeClient, controller: Controller, wait: str) -> None:
    await kube.merge_patch(CAPACITY_POOLS, "gpu", {"spec": {"relaxTopologyAfter": wait}})

    async def applied() -> bool:
        pool = controller.state.pool_registry.pools().get("gpu")
        return pool is not None and pool.spec.relax_topology_after == wait

    await _until(applied)


async def _outcomes(clock: ManualClock, kube: KubeClient, *names: str) -> tuple[str, ...]:
    """The reason each request ends with: Provisioned=True's or Failed's."""

    async def outcome() -> tuple[str, ...] | None:
        await clock.advance(1)
        got = []
        for name in names:
            status = await _status(kube, name)
            done = _cond(status, "Provisioned")
            if done.get("status") != "True":
                done = _cond(status, "Failed")
            if not done:
                return None
            got.append(done["reason"])
        return tuple(got)

    reasons: tuple[str, ...] = await _until(outcome)
    return reasons


async def test_a_pools_default_applies_unless_the_request_says_otherwise(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """No global default (strict), the pool relaxes at once: a plain request takes one block,
    one annotated never stays strict, one whose parameter says never too."""
    controller, clock, _ = running
    await _small_racks(kube, controller)
    await _pool_waits(kube, controller, "0")
    await _request(kube, "plain")
    await _request(kube, "annotated", annotations={RELAX_ANNOTATION: "never"})
    await _request(kube, "parameter", parameters={"relaxTopologyAfter": "never"},
                   annotations={RELAX_ANNOTATION: "0"})
    assert await _outcomes(clock, kube, "plain", "annotated", "parameter") == (
        "CapacityIsProvisioned", "CapacityNeverFits", "CapacityNeverFits")
    details = (await _status(kube, "plain"))["provisioningClassDetails"]
    assert details[RELAXED_DETAIL].startswith("workers=one block b"), details


@pytest.mark.parametrize(
    "muster_config", [MusterConfig(topology={"relax_after_seconds": 0})], ids=["relax-at-once"]
)
async def test_a_pool_that_says_never_overrides_the_global_default(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, clock, _ = running
    await _small_racks(kube, controller)
    await _pool_waits(kube, controller, "never")
    await _request(kube, "plain")
    await _request(kube, "asks", parameters={"relaxTopologyAfter": "0"})
    assert await _outcomes(clock, kube, "plain", "asks") == (
        "CapacityNeverFits", "CapacityIsProvisioned")


@pytest.mark.parametrize(
    "muster_config", [MusterConfig(topology={"reserve_seconds": 3600}), MusterConfig()],
    ids=["reserve", "no-reserve"],
)
async def test_a_gang_past_its_wait_holds_capacity_against_younger_requests(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider],
    muster_config: MusterConfig,
) -> None:
    """The pool has room for 4 nodes and "first" holds 2: "gang" (4 nodes, its wait over at
    once) waits. With topology.reserve_seconds the younger 1-node request may not buy the
    node the gang needs; without, it takes it. Once "first" goes, the gang gets its 4."""
    controller, clock, _ = running
    await kube.merge_patch(CAPACITY_POOLS, "gpu", {"spec": {"maxNodes": 4}})

    async def limited() -> bool:
        pool = controller.state.pool_registry.pools().get("gpu")
        return pool is not None and pool.spec.max_nodes == 4

    await _until(limited)
    await _request(kube, "first", workers=2)
    assert await _outcomes(clock, kube, "first") == ("CapacityIsProvisioned",)
    await _request(kube, "gang", parameters={"relaxTopologyAfter": "0"})

    async def waiting(name: str) -> dict[str, Any]:
        await clock.advance(1)
        cond = _cond(await _status(kube, name), "Provisioned")
        return cond if cond.get("reason") == "CapacityIsNotFound" else {}

    await _until(functools.partial(waiting, "gang"))
    await _request(kube, "young", workers=1)
    if muster_config.topology.reserve_seconds is None:
        assert await _outcomes(clock, kube, "young") == ("CapacityIsProvisioned",)
        return
    cond = await _until(functools.partial(waiting, "young"))
    assert "capacity is held for ns/gang" in cond["message"], cond
    await kube.delete(PROVISIONING_REQUESTS, "first", namespace="ns")
    assert await _outcomes(clock, kube, "gang") == ("CapacityIsProvisioned",)
    assert controller.planner.hold is None
    assert _cond(await _status(kube, "young"), "Provisioned").get("status") != "True"


@pytest.mark.parametrize("where", ["parameter", "annotation"])
async def test_an_unreadable_wait_is_invalid(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider], where: str
) -> None:
    if where == "parameter":
        await _request(kube, "bad", parameters={"relaxTopologyAfter": "soon"})
    else:
        await _request(kube, "bad", annotations={RELAX_ANNOTATION: "-5m"})

    async def failed() -> dict[str, Any]:
        return _cond(await _status(kube, "bad"), "Failed")

    cond = await _until(failed)
    assert cond["reason"] == "InvalidParameters"
    assert "must be a duration such as 30m" in cond["message"]


# ---------------------------------------------------------------------------- pure parts


def test_the_wait_reads_parameter_then_annotation_then_default() -> None:
    assert relax_after(60.0, {RELAX_ANNOTATION: "1h"}, 5.0) == 60.0
    assert relax_after(None, {RELAX_ANNOTATION: "1h"}, 5.0) == 3600.0
    assert relax_after(None, {}, 5.0) == 5.0
    assert relax_after(None, {}, None) is None
    assert relax_after(math.inf, {}, 5.0) is None
    assert relax_after(None, {RELAX_ANNOTATION: "never"}, 5.0) is None
    with pytest.raises(ValueError, match="must be a duration"):
        relax_after(None, {RELAX_ANNOTATION: "1d"}, None)


def test_the_pools_a_gang_may_use_set_its_default_and_the_longest_wait_wins() -> None:
    def pool(name: str, wait: str | None, **labels: str) -> CapacityPool:
        body = objects.gpu_pool(name)
        body["spec"]["nodeTemplate"]["labels"] = {**body["spec"]["nodeTemplate"].get(
            "labels", {}), **labels}
        if wait is not None:
            body["spec"]["relaxTopologyAfter"] = wait
        return CapacityPool.model_validate(body)

    g = gang("g", 4)
    sets = {"workers": objects.RACK}
    a, b = pool("a", "10m"), pool("b", "1h")
    assert pools_default(g, sets, [a], None) == 600
    assert pools_default(g, sets, [a, b], None) == 3600
    # A pool without one counts as the global default (None: never, so strict wins).
    assert pools_default(g, sets, [a, pool("c", None)], 60.0) == 600
    assert pools_default(g, sets, [a, pool("c", None)], None) is None
    assert pools_default(g, sets, [pool("c", None)], 60.0) == 60.0
    assert pools_default(g, sets, [a, pool("n", "never")], 60.0) is None
    # A pool the pods cannot use (its nodes lack the label they select) has no say.
    ps = g.pod_sets[0]
    picky = dataclasses.replace(g, pod_sets=(dataclasses.replace(
        ps, shape=dataclasses.replace(ps.shape, node_selector={"team": "x"})),))
    assert pools_default(picky, sets, [a, pool("x", "1h", team="x")], None) == 3600
    assert pools_default(picky, sets, [a], 60.0) == 60.0
    # Nothing to relax: the global default, whatever the pools say.
    assert pools_default(g, {}, [a], 60.0) == 60.0
    with pytest.raises(ValueError, match="relaxTopologyAfter"):
        pool("bad", "soon")


def test_the_parameter_is_honoured_in_both_classes_so_kueue_may_pass_it() -> None:
    for mode in Mode:
        params = read_parameters({"relaxTopologyAfter": "1h30m"}, mode, "c")
        assert params.values.relax_topology_after_seconds == 5400
        assert not params.ignored and not params.problems


def test_only_musters_own_required_annotation_is_relaxed() -> None:
    g = gang("g", 4)
    rack = objects.RACK
    assert relaxable(g, [{MUSTER_REQUIRED: "rack"}], DEFAULT_LEVELS) == {"workers": rack}
    # Kueue TAS assigns the topology itself and would not admit a relaxed placement.
    assert relaxable(g, [{MUSTER_REQUIRED: "rack", KUEUE_REQUIRED: rack}], DEFAULT_LEVELS) == {}
    assert relaxable(g, [{KUEUE_REQUIRED: rack}], DEFAULT_LEVELS) == {}
    # A requirement pod affinity imposed at another level is not the annotation's.
    assert relaxable(g, [{MUSTER_REQUIRED: "block"}], DEFAULT_LEVELS) == {}


def test_relaxed_gangs_go_one_wider_domain_first_then_fewest_domains() -> None:
    g = gang("g", 4, level=objects.HOSTNAME)
    tried = [
        (a.pod_sets[0].topology.mode, a.pod_sets[0].topology.level)
        for a in alternatives(g, {"workers": objects.HOSTNAME}, DEFAULT_LEVELS)
    ]
    assert tried == [
        (TopologyMode.REQUIRED, objects.RACK),
        (TopologyMode.REQUIRED, objects.BLOCK),
        (TopologyMode.PREFERRED, objects.HOSTNAME),
    ]
