"""Deleted requests leave nothing behind: not in the cache, not in the bookings the planner
subtracts, not in the health figures or the metrics gauges, not in per-request bookkeeping.

A long-running controller handles requests without end; anything it keeps per request
after the request is gone is a leak (and shows up as requests that are not there).
"""

from __future__ import annotations

import asyncio
import functools
from datetime import UTC, datetime, timedelta
from pathlib import Path

from controller.commands import objects
from controller.common.clock import ManualClock
from controller.common.topology_defaults import DEFAULT_LEVELS
from controller.config import MusterConfig
from controller.kube import Body, KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    NAMESPACES,
    NODES,
    POD_TEMPLATES,
    PROVISIONING_REQUESTS,
)
from controller.operator import Controller
from controller.reconcilers.telemetry import state_reading
from controller.state.cache import ClusterState
from controller.state.object_store import DELETED_SECONDS
from providers.fake import FakeProvider
from sandbox.server import SandboxServer
from tests.helpers import eventually

_until = functools.partial(eventually, within=30.0, step=0.05)
REQUESTS = 24


async def _provisioned(kube: KubeClient, name: str) -> bool:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return any(c["type"] == "Provisioned" and c["status"] == "True"
               for c in (pr.get("status") or {}).get("conditions") or [])


class SlowAnswers(KubeClient):
    """A loaded API server: the answer to a write arrives after the watch events it
    caused (the deletion its finalizer removal completed, say)."""

    async def merge_patch(self, *args: object, **kwargs: object) -> Body:
        body = await super().merge_patch(*args, **kwargs)  # type: ignore[arg-type]
        await asyncio.sleep(0.3)
        return body


async def test_deleted_requests_leave_the_cache_bookings_and_gauges_empty(
    server: SandboxServer, kube: KubeClient, tmp_path: Path,
) -> None:
    await kube.create(NAMESPACES, {"metadata": {"name": "ns"}})
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu", max_nodes=REQUESTS))
    await kube.create(POD_TEMPLATES, objects.pod_template(
        "workers", namespace="ns", requests={"cpu": "90", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
    ), namespace="ns")
    clock = ManualClock(start=datetime.now(UTC))
    slow = await SlowAnswers.from_kubeconfig(server.write_kubeconfig(tmp_path / "slow"))
    provider = FakeProvider(kube, heartbeat_seconds=3600)
    controller = Controller(kube=slow, config=MusterConfig(), clock=clock,
                            providers={"kind": provider})
    await controller.start()
    try:
        names = [f"r{i}" for i in range(REQUESTS)]
        for name in names:
            await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
                name, namespace="ns", pod_sets=[("workers", 1)]), namespace="ns")

        async def all_provisioned() -> bool:
            return all([await _provisioned(kube, n) for n in names])

        await _until(all_provisioned)
        for name in names:
            await kube.delete(PROVISIONING_REQUESTS, name, namespace="ns")

        async def all_gone() -> bool:
            return not (await kube.list(PROVISIONING_REQUESTS))["items"]

        await _until(all_gone)
        reading = state_reading(
            state=controller.state, served=lambda _: True, in_flight=lambda: 0,
            queue=controller.queue, events=controller.events,
        )

        async def forgotten() -> dict[str, object] | None:
            health = controller.health()
            left = {"requests": health["requests"], "bookings": health["bookings"],
                    "gauge": dict(reading().requests_by_phase)}
            if left["requests"] == 0 and left["bookings"] == 0 and not any(
                left["gauge"].values()  # type: ignore[attr-defined]
            ):
                return None
            return left

        # The deletion events, the finalizer writes' answers and the reconciles all land
        # within moments; then nothing of any request may be left.
        await _until(lambda: _quiet(controller))
        assert await forgotten() is None
        assert not controller.state.ledger.bookings()
        assert not controller.state.objects._consumed, "per-request consumer counts"
        assert not controller.queue._failures and not controller.queue._timers
        assert not provider._key_locks and not provider._since, "the fake provider's"
        assert provider.calls.maxlen, "its call log is bounded"
        assert not (await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]
    finally:
        await controller.stop()
        await slow.close()


async def _quiet(controller: Controller) -> bool:
    return controller.queue.busy == 0


def _request(i: int) -> Body:
    body = objects.provisioning_request(f"r{i}", namespace="ns", pod_sets=[("workers", 1)])
    body["metadata"].update(uid=f"uid-{i}", resourceVersion=str(i))
    return body


def test_deleted_uids_are_remembered_for_a_while_not_for_ever() -> None:
    """A request deleted while a write to it is in flight stays deleted when the write's
    answer arrives; but a controller deleting requests without end keeps only the last
    minutes' uids, not every uid it ever saw (the soak's memory grew with them)."""
    state = ClusterState(levels=DEFAULT_LEVELS)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    interval = 15.0  # the collector's default pass
    per_pass = 8  # 0.5 deletions/s
    remembered: list[int] = []
    i = 0
    for n in range(int(6 * 3600 / interval)):
        now = start + timedelta(seconds=n * interval)
        state.prune_vanished(now)
        for _ in range(per_pass):
            body = _request(i)
            assert state.upsert_request(body) is not None
            state.delete_request("ns/" + body["metadata"]["name"])
            i += 1
        remembered.append(len(state.objects._deleted) + len(state.objects._deleted_before))
    # At most two generations of DELETED_SECONDS, from the first hour to the sixth.
    bound = 2 * DELETED_SECONDS / interval * per_pass + per_pass
    assert max(remembered) <= bound
    hour = len(remembered) // 6
    assert max(remembered[hour:2 * hour]) == max(remembered[5 * hour:])

    # The last pass's deletions: an answer to a write sent before them is refused.
    last = _request(i - 1)
    assert state.upsert_request(last) is None
    # Still refused a whole generation later...
    now = start + timedelta(seconds=6 * 3600 + DELETED_SECONDS)
    state.prune_vanished(now)
    assert state.upsert_request(last) is None
    # ...and forgotten after two: by then no answer sent before the deletion is in flight.
    state.prune_vanished(now + timedelta(seconds=DELETED_SECONDS))
    assert state.upsert_request(last) is not None
