"""Provider and API faults on the real control plane, with the crash harness's invariants
(:mod:`e2e.chaos`): each injected fault of the fake provider in turn (stock-out, quota,
throttling, a timeout that created nodes, k of n granted, a release refused), a 5xx/409
storm with watches cut every few seconds (:mod:`e2e.faultproxy` between Muster and the API
server), and kube-apiserver down for a minute. Muster never exits, its /readyz says when it
cannot make progress, and its log says each problem once per interval, not per attempt."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.kube.resources import NODES, PROVISIONING_REQUESTS
from e2e import cluster as cp
from e2e.chaos import Chaos, Options
from e2e.conftest import eventually
from e2e.faultproxy import FaultProxy, describe
from e2e.real import MusterProcess

pytestmark = pytest.mark.real

LOG_INTERVAL = 30.0  # controller.runtime.problems.LOG_INTERVAL


@pytest.fixture
def muster_set_aside(real_cluster: cp.Cluster, real_muster: MusterProcess) -> Iterator[cp.Cluster]:
    real_muster.stop()
    try:
        yield real_cluster
    finally:
        real_muster.start()


def _problem_lines(lines: list[str]) -> Counter[str]:
    """Warnings and errors by problem: the message with numbers and quoted names blanked.
    An acquisition key stays told apart (as a letter code): a line per failed acquisition
    (its machines rolled back) is one line per acquisition, not a problem said again."""
    out: Counter[str] = Counter()
    keys: dict[str, int] = {}

    def key_code(m: re.Match[str]) -> str:
        return "key-" + "".join(chr(ord("g") + int(d)) for d in str(
            keys.setdefault(m.group(0), len(keys))))

    for line in lines:
        if " WARNING " not in line and " ERROR " not in line:
            continue
        msg = line.split(": ", 1)[-1]
        msg = re.sub(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}(?:-\d+)*", key_code, msg)
        msg = re.sub(r"\(\d+ more [^)]*\)", "", msg)
        msg = re.sub(r"[0-9a-f]{6,}|\d+(\.\d+)?", "N", msg)
        msg = re.sub(r"\?\S*", "", msg)
        msg = re.sub(r"chaos-\S+", "X", msg)
        out[msg[:120]] += 1
    return out


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def test_each_provider_fault_in_turn_then_all_at_once_with_crashes(
    muster_set_aside: cp.Cluster,
) -> None:
    async def scenario() -> Chaos:
        chaos = Chaos(muster_set_aside, Options(seed=23, settle=20))
        async with chaos.session():
            muster = chaos.muster
            muster.new_lines()
            await chaos._start(muster)
            assert chaos.kube is not None
            kube = chaos.kube

            async def pool_empty() -> bool:
                listing = await kube.list(NODES,
                                          label_selector=f"fake.muster.dev/pool={chaos.pool}")
                return not listing.get("items")

            for kind in ("stockOut", "quota", "throttle", "timeout", "partial"):
                # No node left from the kind before: the request must go to the provider
                # (an atomic request fits existing free nodes first).
                for old in list(chaos.alive):
                    await kube.delete(PROVISIONING_REQUESTS, old, namespace=chaos.ns)
                    chaos.alive.remove(old)
                await eventually(pool_empty, within=60, step=0.2, what="the pool's nodes released")
                await chaos._set_pool_parameter("faults", {kind: 1, "timeoutSeconds": 1})
                await chaos.arrive(1, atomic=True)
                name = f"{chaos.ns}/r{chaos.seq}"

                async def reported(kind: str = kind, name: str = name) -> bool:
                    return name in chaos.rec.faults.get(kind, set())

                await eventually(reported, within=45, step=0.2,
                                 what=f"the {kind} fault on the request's condition")
                await chaos._set_pool_parameter("faults", None)
            # A release the provider refuses: retried by the collector, said once.
            await chaos.arrive(1, atomic=True)
            victim = f"r{chaos.seq}"

            async def booked() -> bool:
                body = chaos.rec.current.get(f"{chaos.ns}/{victim}") or {}
                return any(c.get("type") == "Provisioned" and c.get("status") == "True"
                           for c in (body.get("status") or {}).get("conditions") or [])

            await eventually(booked, within=60, step=0.2, what="the request booked")
            await chaos._set_pool_parameter("faults", {"releaseError": 1})
            assert chaos.kube is not None
            await chaos.kube.delete(PROVISIONING_REQUESTS, victim, namespace=chaos.ns)
            await asyncio.sleep(12)  # the collector retries every second meanwhile
            left = await chaos.kube.list(NODES, label_selector=f"fake.muster.dev/pool={chaos.pool}")
            assert left.get("items"), "the refused release kept the nodes (for now)"
            refused = [ln for ln in muster.new_lines() if "failed: pool" in ln
                       and "releasing" in ln and "injected fault" in ln]
            assert 1 <= len(refused) <= 2, refused
            await chaos._set_pool_parameter("faults", None)
            # Everything at once, with crashes: the long run's mix.
            await chaos._set_pool_parameter("faults", {
                "seed": 5, "stockOut": 0.15, "quota": 0.05, "throttle": 0.15, "timeout": 0.1,
                "partial": 0.15, "releaseError": 0.3, "timeoutSeconds": 1})
            for _ in range(3):
                await chaos.crash_round()
        return chaos

    chaos = asyncio.run(scenario())
    assert not chaos.result.violations, "\n".join(chaos.result.violations)
    assert set(chaos.rec.faults) >= {"stockOut", "quota", "throttle", "timeout", "partial"}
    assert any(k.startswith("Failed/") for k in chaos.result.outcomes), chaos.result.outcomes


def test_a_5xx_and_409_storm_with_watches_cut_is_ridden_out_and_logged_once_per_problem(
    muster_set_aside: cp.Cluster, tmp_path: Path,
) -> None:
    storm_seconds = 45.0

    async def scenario() -> tuple[Chaos, FaultProxy, list[str]]:
        proxy = FaultProxy(muster_set_aside, muster_set_aside.ports.base + 24, seed=29)
        await proxy.start()
        chaos = Chaos(muster_set_aside, Options(seed=29, settle=45))
        chaos.muster.kubeconfig = proxy.kubeconfig(tmp_path / "via-proxy.kubeconfig")
        try:
            async with chaos.session():
                await chaos._start(chaos.muster)
                chaos.muster.new_lines()
                proxy.error_rate, proxy.conflict_rate = 0.3, 0.3
                proxy.drop_watches_after = 3.0
                start = time.monotonic()
                while time.monotonic() - start < storm_seconds:
                    await chaos.arrive(1)
                    await asyncio.sleep(3)
                    assert chaos.muster.running, "Muster exited during the storm:\n" + \
                        chaos.muster.tail()
                during = chaos.muster.new_lines()
                proxy.calm()
        finally:
            await proxy.stop()
        return chaos, proxy, during

    chaos, proxy, during = asyncio.run(scenario())
    assert not chaos.result.violations, "\n".join(chaos.result.violations)
    assert proxy.injected["500"] + proxy.injected["503"] > 50, describe(proxy)
    assert proxy.injected["409"] > 10 and proxy.injected["watch-dropped"] > 5, describe(proxy)
    assert not [ln for ln in during if "Traceback" in ln], "\n".join(during[-40:])
    per_problem = _problem_lines(during)
    most = storm_seconds / LOG_INTERVAL + 1
    assert all(n <= most for n in per_problem.values()), per_problem.most_common(5)
    assert sum(per_problem.values()) < sum(proxy.injected.values()) / 3, (
        per_problem, describe(proxy))


def test_an_apiserver_down_for_a_minute_is_told_by_readyz_and_ridden_out(
    muster_set_aside: cp.Cluster,
) -> None:
    cluster = muster_set_aside
    down_seconds = 60.0

    async def scenario() -> tuple[Chaos, list[int], list[int], list[str]]:
        chaos = Chaos(cluster, Options(seed=31, settle=45))
        async with chaos.session():
            muster = chaos.muster
            await chaos._start(muster)
            await chaos.arrive(3)
            await asyncio.sleep(2)
            muster.new_lines()
            await asyncio.to_thread(cp.stop_apiserver, cluster)
            ready: list[int] = []
            live: list[int] = []
            try:
                start = time.monotonic()
                while time.monotonic() - start < down_seconds:
                    ready.append(await asyncio.to_thread(_status, muster.probe_port, "/readyz"))
                    live.append(await asyncio.to_thread(_status, muster.probe_port, "/healthz"))
                    assert muster.running, "Muster exited while the API server was down:\n" + \
                        muster.tail()
                    await asyncio.sleep(2)
            finally:
                await asyncio.to_thread(cp.start_apiserver, cluster, cp.build())
            during = muster.new_lines()
            await asyncio.to_thread(muster.wait_ready, 120.0)
            await chaos.arrive(2)
        return chaos, ready, live, during

    chaos, ready, live, during = asyncio.run(scenario())
    assert not chaos.result.violations, "\n".join(chaos.result.violations)
    assert set(live) == {200}, f"/healthz during the outage: {live}"
    assert ready[0] == 200 and 503 in ready, f"/readyz during the outage: {ready}"
    first_503 = ready.index(503) * 2
    assert first_503 <= 40, f"/readyz said 503 only after {first_503}s"
    assert not [ln for ln in during if "Traceback" in ln], "\n".join(during[-40:])
    per_problem = _problem_lines(during)
    most = down_seconds / LOG_INTERVAL + 1
    assert all(n <= most for n in per_problem.values()), per_problem.most_common(5)
