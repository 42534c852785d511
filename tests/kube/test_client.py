"""KubeClient's request path: cancelled callers never poison the connection pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controller.kube import ApiError, KubeClient
from controller.kube.resources import NODES
from sandbox.server import SandboxServer


async def test_a_cancelled_caller_lets_its_request_finish_and_drain_waits_for_it(
    server: SandboxServer, kube: KubeClient,
) -> None:
    srv, client = server, kube
    rule = srv.faults.add_latency(0.3, verbs="list", resources="nodes")
    callers = [asyncio.create_task(client.list(NODES)) for _ in range(4)]
    await asyncio.sleep(0.05)  # sent, waiting for the answers
    for c in callers:
        c.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    assert await client.drain(within=0.01) == 4, "the requests still run, shielded"
    assert await client.drain(within=5) == 0
    srv.faults.remove(rule)
    # Every pooled connection answers the next requests at once.
    got = await asyncio.wait_for(asyncio.gather(*(client.list(NODES) for _ in range(8))), 2)
    assert all(g["items"] == [] for g in got)


async def test_transport_failures_are_api_errors_with_status_0(tmp_path: Path) -> None:
    srv = SandboxServer()
    await srv.start()
    client = await KubeClient.from_kubeconfig(srv.write_kubeconfig(tmp_path / "kc"))
    await srv.stop()  # nothing listens any more
    try:
        with pytest.raises(ApiError) as info:
            await client.list(NODES)
        assert info.value.status == 0
    finally:
        await client.close()


async def test_stopping_the_controller_lets_requests_in_flight_finish(
    server: SandboxServer, kube: KubeClient,
) -> None:
    # The caller closes the client once the controller stopped: a request of Muster's
    # still waiting for its answer (its caller cancelled) must be done by then, not cut
    # mid-answer (that would leave a broken connection in the client's pool).
    from controller.commands import objects
    from controller.config import MusterConfig
    from controller.kube.resources import CAPACITY_POOLS
    from controller.operator import Controller

    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu"))
    controller = Controller(kube=kube, config=MusterConfig())
    await controller.start()
    rule = server.faults.add_latency(2.0, verbs="list", resources="nodes")
    caller = asyncio.create_task(kube.list(NODES))
    await asyncio.sleep(0.1)
    (request,) = kube._inflight
    caller.cancel()
    await asyncio.gather(caller, return_exceptions=True)
    await controller.stop()
    assert request.done() and not request.cancelled(), "stop did not wait for the request"
    server.faults.remove(rule)
    got = await asyncio.wait_for(asyncio.gather(*(kube.list(NODES) for _ in range(8))), 5)
    assert len(got) == 8


async def test_an_answer_with_retry_after_is_retried_as_client_go_does(
    server: SandboxServer, kube: KubeClient,
) -> None:
    # A real API server answers 429 + Retry-After while a new CRD's watch cache initialises
    # ("storage is (re)initializing"); Muster used to give up at once, even at start-up.
    server.faults.add_errors(1.0, status=429, verbs="list", resources="nodes", times=2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    listing = await kube.list(NODES)
    assert listing["items"] == []
    assert server.faults.injected == 2
    assert loop.time() - start >= 2 * 0.9, "it waited the Retry-After each time"


async def test_a_5xx_without_retry_after_is_not_retried(
    server: SandboxServer, kube: KubeClient,
) -> None:
    server.faults.add_errors(1.0, status=500, verbs="list", resources="nodes", times=1)
    with pytest.raises(ApiError) as info:
        await kube.list(NODES)
    assert info.value.status == 500 and server.faults.injected == 1


async def test_serves_tells_which_api_versions_the_server_has(kube: KubeClient) -> None:
    assert await kube.serves("v1")
    assert await kube.serves("muster.dev/v1alpha1")
    assert not await kube.serves("nothing.example/v1")
