"""Fault injection switched on at runtime: latency, 5xx rates on chosen verbs/resources,
conflict storms, dropped watch streams; seeded for determinism; never affects the in-process
store API."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from sandbox import SandboxServer
from tests.sandbox.conftest import Http, pod
from tests.sandbox.util import eventually

pytestmark = pytest.mark.timeout(20)
PODS = "/api/v1/namespaces/default/pods"


async def test_added_latency_delays_matching_requests_only(
    server: SandboxServer, http: Http,
) -> None:
    server.faults.add_latency(0.6, verbs="list", resources="pods")
    loop = asyncio.get_running_loop()
    start = loop.time()
    await http.get(PODS)
    assert loop.time() - start >= 0.6
    start = loop.time()
    await http.get("/api/v1/nodes")
    assert loop.time() - start < 0.6


async def test_error_rate_on_chosen_verbs_returns_5xx_status(
    server: SandboxServer, http: Http,
) -> None:
    server.store.create("pods", pod("p"))
    server.faults.add_errors(1.0, status=503, verbs=["patch"], resources=["pods"])
    code, status = await http.patch(f"{PODS}/p", {"metadata": {"labels": {"a": "b"}}})
    assert code == 503 and status["reason"] == "ServiceUnavailable"
    code, _ = await http.get(f"{PODS}/p")
    assert code == 200
    server.faults.clear()
    code, _ = await http.patch(f"{PODS}/p", {"metadata": {"labels": {"a": "b"}}})
    assert code == 200


async def test_an_error_can_hit_one_subresource_a_given_number_of_times(
    server: SandboxServer, http: Http,
) -> None:
    server.store.create("pods", pod("p"))
    server.faults.add_errors(1.0, status=503, verbs="patch", resources="pods/status", times=1)
    code, _ = await http.patch(f"{PODS}/p", {"metadata": {"labels": {"a": "b"}}})
    assert code == 200, "the main resource is not the status subresource"
    code, _ = await http.patch(f"{PODS}/p/status", {"status": {"phase": "Running"}})
    assert code == 503
    code, _ = await http.patch(f"{PODS}/p/status", {"status": {"phase": "Running"}})
    assert code == 200, "only the first one"


async def _failures(seed: int) -> list[int]:
    async with SandboxServer(seed=seed) as server, aiohttp.ClientSession() as session:
        server.faults.add_errors(0.5, verbs="get")
        codes = []
        for _ in range(40):
            async with session.get(f"{server.url}/api/v1/namespaces/default") as resp:
                codes.append(resp.status)
        return codes


async def test_fault_draws_are_deterministic_for_a_seed() -> None:
    first, second, other = await _failures(7), await _failures(7), await _failures(8)
    assert first == second
    assert first != other
    assert 5 < first.count(500) < 35


async def test_conflict_storm_fails_writes_with_409_but_not_reads(
    server: SandboxServer, http: Http,
) -> None:
    server.store.create("pods", pod("p"))
    server.faults.add_conflicts(1.0, resources="pods")
    code, status = await http.patch(f"{PODS}/p", {"metadata": {"labels": {"a": "b"}}})
    assert code == 409 and status["reason"] == "Conflict"
    code, _ = await http.get(f"{PODS}/p")
    assert code == 200
    # The in-process API used for fixtures is never disturbed.
    server.store.patch("pods", "p", {"metadata": {"labels": {"a": "b"}}})


async def test_closing_active_watches_ends_their_streams(server: SandboxServer) -> None:
    async with aiohttp.ClientSession() as session, session.get(
        f"{server.url}{PODS}", params={"watch": "true"},
    ) as resp:
        await eventually(lambda: server.faults.close_watches("pods") == 1, within=5)
        async with asyncio.timeout(5):
            rest = await resp.content.read()
        assert rest == b""


async def test_watch_dropped_every_n_events(server: SandboxServer) -> None:
    server.faults.drop_watches_every(2, resources="pods")
    rv = str(server.store.resource_version)
    for i in range(5):
        server.store.create("pods", pod(f"p{i}"))
    async with aiohttp.ClientSession() as session, session.get(
        f"{server.url}{PODS}", params={"watch": "true", "resourceVersion": rv},
    ) as resp:
        async with asyncio.timeout(5):
            lines = (await resp.content.read()).splitlines()
    assert [json.loads(x)["object"]["metadata"]["name"] for x in lines] == ["p0", "p1"]


def test_fault_switches_reject_bad_input(server: SandboxServer) -> None:
    with pytest.raises(ValueError):
        server.faults.add_errors(1.5)
    with pytest.raises(ValueError):
        server.faults.add_errors(0.5, status=404)
    with pytest.raises(ValueError):
        server.faults.add_latency(-1)
    with pytest.raises(ValueError):
        server.faults.add_conflicts(0.5, verbs="explode")
