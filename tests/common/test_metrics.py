"""Prometheus metrics of the controller, scraped from ``/metrics`` as Prometheus would.

The controller runs against the API sandbox with the fake provider; ``/metrics`` is served by
the same aiohttp app as in ``muster run`` on a loopback port.
"""

from __future__ import annotations

import functools

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from controller.commands import objects
from controller.commands.probes import Probes
from controller.common.clock import ManualClock
from controller.common.metrics import ControllerMetrics
from controller.kube import KubeClient
from controller.kube.resources import (
    PROVISIONING_REQUESTS,
)
from controller.operator import Controller
from providers.fake import FakeProvider
from tests.cluster_objects import starve
from tests.helpers import eventually

_until = functools.partial(eventually, within=10.0, step=0.02)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def _scrape(controller: Controller) -> Samples:
    runner = web.AppRunner(Probes(controller, None).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as http, \
                http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await resp.text()
    finally:
        await runner.cleanup()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def _provisioned(kube: KubeClient, name: str) -> bool:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return any(c["type"] == "Provisioned" and c["status"] == "True"
               for c in (pr.get("status") or {}).get("conditions") or [])


async def test_a_provisioned_request_moves_the_counters_and_the_histogram(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, clock, _ = running
    before = await _scrape(controller)
    assert _get(before, "muster_request_time_to_provisioned_seconds_count") == 0
    assert _get(before, "muster_requests", phase="Booked") == 0

    # The controller's clock runs 42 s ahead of the API server's, as if the request had
    # waited that long (advanced first, so no reconcile can finish before it).
    await clock.advance(42)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "gang", namespace="ns", pod_sets=[("workers", 3)]), namespace="ns")
    await _until(lambda: _provisioned(kube, "gang"))
    await _until(lambda: _events_created(controller))
    after = await _scrape(controller)

    assert _get(after, "muster_request_time_to_provisioned_seconds_count") == 1
    assert _get(after, "muster_request_time_to_provisioned_seconds_bucket", le="30.0") == 0
    assert _get(after, "muster_request_time_to_provisioned_seconds_bucket", le="60.0") == 1
    assert 41 <= _get(after, "muster_request_time_to_provisioned_seconds_sum") <= 44
    assert _get(after, "muster_reconciles_total", outcome="requeued") >= 1, (
        "a booked request is looked at again when its booking ends")
    assert _get(after, "muster_provider_acquisitions_total", pool="gpu", result="success") == 1
    assert _get(after, "muster_nodes_acquired_total", pool="gpu") == 3
    assert _get(after, "muster_request_condition_transitions_total", condition="Provisioned",
                status="True", reason="CapacityIsProvisioned") == 1
    assert _get(after, "muster_requests", phase="Booked") == 1
    assert _get(after, "muster_bookings") == 1
    assert _get(after, "muster_acquisitions_in_flight") == 0
    assert _get(after, "muster_workqueue_depth") == 0
    assert _get(after, "muster_planner_passes_total") >= 1
    assert _get(after, "muster_planner_pass_duration_seconds_count") == _get(
        after, "muster_planner_passes_total")
    assert _get(after, "muster_events_total", result="created") == 1


async def _events_created(controller: Controller) -> bool:
    return controller.events.created >= 1


async def test_a_stock_out_is_counted_by_pool_and_reason(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, _, provider = running
    starve(provider)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "starved", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")

    async def counted() -> bool:
        samples = await _scrape(controller)
        return _get(samples, "muster_provider_acquisitions_total", pool="gpu",
                    result="CapacityUnavailable") == 1

    await _until(counted)
    samples = await _scrape(controller)
    assert _get(samples, "muster_provider_acquisitions_total", pool="gpu", result="success") == 0
    assert _get(samples, "muster_nodes_acquired_total", pool="gpu") == 0
    # The failed attempt was rolled back: all or nothing releases the group it asked for.
    assert _get(samples, "muster_provider_releases_total", pool="gpu", result="success") >= 1
    assert _get(samples, "muster_request_time_to_provisioned_seconds_count") == 0


def test_each_controller_has_its_own_registry() -> None:
    one, two = ControllerMetrics(), ControllerMetrics()  # no "Duplicated timeseries" error
    one.reconciles.labels("done").inc()
    assert b'muster_reconciles_total{outcome="done"} 1.0' in one.exposition()
    assert b'outcome="done"' not in two.exposition()
