"""Topology relaxation (controller/relaxation.py): a gang that waited its
``relaxTopologyAfter`` for the one rack ``muster.dev/required-topology`` asks for takes the
most compact placement it can get, and says so."""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest

from controller.api.parameters import read_parameters
from controller.clock import ManualClock
from controller.commands import objects
from controller.config import MusterConfig
from controller.fit.types import Mode, TopologyMode
from controller.kube import KubeClient
from controller.kube.resources import CAPACITY_POOLS, PROVISIONING_REQUESTS
from controller.operator import Controller
from controller.relaxation import (
    RELAX_ANNOTATION,
    RELAXED_DETAIL,
    alternatives,
    relax_after,
    relaxable,
)
from controller.topology_defaults import DEFAULT_LEVELS, KUEUE_REQUIRED, MUSTER_REQUIRED
from providers.fake import FakeProvider
from tests.controller.builders import gang
from tests.helpers import eventually

_until = functools.partial(eventually, within=10.0, step=0.02)
RACKS = {f"b{b}-r{r}": 2 for b in (1, 2) for r in range(1, 5)}
"""Every rack of the "gpu" pool may hold 2 nodes: no rack ever holds a 4-node gang."""


async def _small_racks(kube: KubeClient, controller: Controller) -> None:
    domains = objects.gpu_pool("gpu", rack_limits=RACKS)["spec"]["topology"]["domains"]
    await kube.merge_patch(CAPACITY_POOLS, "gpu", {"spec": {"topology": {"domains": domains}}})

    async def applied() -> bool:
        pool = controller.state.pools().get("gpu")
        return pool is not None and all(d.max_nodes == 2 for d in pool.spec.topology.domains)

    await _until(applied)


async def _request(
    kube: KubeClient,
    name: str,
    *,
    parameters: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> None:
    body = objects.provisioning_request(
        name, namespace="ns", pod_sets=[("workers", 4)], parameters=parameters
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
    groups = controller.state.request("ns/relaxing").booking.groups  # type: ignore[union-attr]
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
