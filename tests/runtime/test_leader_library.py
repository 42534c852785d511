"""Why Muster keeps its own Lease elector (:mod:`controller.runtime.leader`) instead of
``kubernetes_asyncio.leaderelection``: the same scenarios, run against both, over real HTTP
to the API sandbox.

- **A renewal that hangs.** A leader cut off from the API server by a partition that drops
  packets (no error, no reset: requests simply never answer) must stop acting within its
  renew deadline, before a standby can take over. Muster's elector bounds every attempt and
  gives up in time. The library awaits the renewal with no timeout (its API client's default
  ``aiohttp.ClientTimeout()`` has none) and measures its deadline only between attempts, so
  its leader keeps running its work while the standby already leads: two leaders.
- **Release on a clean stop.** Muster's elector hands the Lease back (empty holder) on
  SIGTERM, so a standby takes over at its next retry. The library has no release: a rollout
  costs a full lease duration without a leader.

The library also refuses sub-second durations (``retry_period < 1``), so both run here with
lease 3 s, renew deadline 2 s, retry period 1 s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from controller.kube import KubeClient
from controller.kube.resources import NAMESPACES
from controller.runtime.leader import LeaderElector
from sandbox.server import SandboxServer

NS = "muster-system"
LEASE = "muster"
LEASE_DURATION = 3


class Blackhole:
    """A TCP proxy to the API server that can stop forwarding without closing anything:
    what a leader sees when a partition drops its packets (requests hang, no error comes)."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def cut(self) -> None:
        self._open.clear()

    def restore(self) -> None:
        self._open.set()

    async def stop(self) -> None:
        self.restore()
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
        self._writers += [writer, up_writer]
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer),
                             return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            await self._open.wait()  # cut: the bytes are held, nobody hears of it
            writer.write(data)
            await writer.drain()
        writer.close()


@pytest.fixture
async def blackhole(server: SandboxServer, kube: KubeClient) -> AsyncIterator[tuple[Blackhole,
                                                                                  str]]:
    await kube.create(NAMESPACES, {"metadata": {"name": NS}})
    port = int(server.kubeconfig()["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1])
    proxy = Blackhole(port)
    url = await proxy.start()
    try:
        yield proxy, url
    finally:
        await proxy.stop()


class LibraryLeader:
    """kubernetes_asyncio's elector with a work task, as its docs use it: the work runs
    as ``onstarted_leading`` and is cancelled when the elector stops leading."""

    def __init__(self, url: str, identity: str) -> None:
        configuration = k8s.Configuration()
        configuration.host = url
        configuration.api_key = {"authorization": "Bearer sandbox"}
        self.api = k8s.ApiClient(configuration)
        self.leading = asyncio.Event()
        self.stopped = asyncio.Event()
        config = electionconfig.Config(
            LeaseLock(LEASE, NS, identity, self.api),
            lease_duration=LEASE_DURATION,
            renew_deadline=2.0,
            retry_period=1.0,
            onstarted_leading=self._work,
            onstopped_leading=self._stopped,
        )
        self.task = asyncio.create_task(leaderelection.LeaderElection(config).run())

    async def _work(self) -> None:
        self.leading.set()
        try:
            await asyncio.Event().wait()  # reconciles until told to stop
        finally:
            self.stopped.set()

    async def _stopped(self) -> None:
        self.stopped.set()

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.api.close()


def _muster(kube: KubeClient, identity: str) -> LeaderElector:
    return LeaderElector(kube, name=LEASE, namespace=NS, identity=identity,
                         lease_duration_seconds=LEASE_DURATION, renew_deadline_seconds=2.0,
                         retry_period_seconds=1.0)


async def _client(url: str, tmp_path: Path, server: SandboxServer) -> KubeClient:
    """Muster's client of the API server, through ``url``."""
    config = server.kubeconfig()
    config["clusters"][0]["cluster"]["server"] = url
    path = tmp_path / "through-proxy"
    path.write_text(yaml.safe_dump(config))
    return await KubeClient.from_kubeconfig(path)


async def _takeover(standby: LeaderElector, stopped: Callable[[], bool]
                    ) -> tuple[float, bool]:
    """Campaign until the standby leads; how long it took, and whether the old leader had
    stopped acting by then."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.wait_for(standby.acquire(), timeout=15)
    return loop.time() - start, stopped()


async def test_a_leader_whose_renewal_hangs_stops_before_the_standby_leads(
    blackhole: tuple[Blackhole, str], kube: KubeClient, server: SandboxServer, tmp_path: Path,
) -> None:
    proxy, url = blackhole
    through_proxy = await _client(url, tmp_path, server)
    leader = _muster(through_proxy, "pod-a")
    await leader.acquire()
    proxy.cut()
    standby = _muster(kube, "pod-b")
    took, leader_had_stopped = await _takeover(standby, lambda: leader.lost.is_set())
    print(f"\nstandby led {took:.2f}s after the cut; muster's leader had stopped")
    assert leader_had_stopped and not leader.is_leader
    await standby.release()
    proxy.restore()
    await leader.release()
    await through_proxy.close()


async def test_the_library_leader_keeps_acting_through_a_hung_renewal(
    blackhole: tuple[Blackhole, str], kube: KubeClient,
) -> None:
    """The measured reason not to use the library: the same partition leaves two leaders."""
    proxy, url = blackhole
    leader = LibraryLeader(url, "library-a")
    await asyncio.wait_for(leader.leading.wait(), timeout=10)
    proxy.cut()
    standby = _muster(kube, "pod-b")
    took, leader_had_stopped = await _takeover(standby, leader.stopped.is_set)
    print(f"\nstandby led {took:.2f}s after the cut; the library's leader still acting")
    assert took >= 1.0  # the standby waited for the lease to expire, as it should
    assert not leader_had_stopped  # ...but the library's leader is still at work
    await asyncio.sleep(LEASE_DURATION)
    assert not leader.stopped.is_set()  # and stays so: its renewal never times out
    await standby.release()
    proxy.restore()
    await leader.close()


async def _stop_and_measure(stop: Callable[[], Awaitable[object]], kube: KubeClient) -> float:
    standby = _muster(kube, "pod-b")
    campaign = asyncio.create_task(standby.acquire())
    await asyncio.sleep(1.5)  # the standby has read the held Lease
    assert not campaign.done()
    loop = asyncio.get_running_loop()
    await stop()
    stopped = loop.time()
    await asyncio.wait_for(campaign, timeout=15)
    took = loop.time() - stopped
    await standby.release()
    return took


async def test_muster_hands_the_lease_over_on_a_clean_stop_the_library_does_not(
    blackhole: tuple[Blackhole, str], kube: KubeClient,
) -> None:
    _, url = blackhole
    muster = _muster(kube, "pod-a")
    await muster.acquire()
    muster_took = await _stop_and_measure(muster.release, kube)
    # At most one jittered retry period (2.2 s), not the lease duration after the last
    # renewal the standby saw.
    assert muster_took < 2.3

    library = LibraryLeader(url, "library-a")
    await asyncio.wait_for(library.leading.wait(), timeout=10)
    library_took = await _stop_and_measure(library.close, kube)
    # Nothing handed back: the standby waits out the lease duration from the last renewal
    # it saw (which was at most one retry period before the stop).
    assert library_took >= LEASE_DURATION - 1.0 - 0.1
    assert library_took > muster_took
    print(f"\ntakeover after a clean stop: muster {muster_took:.2f}s, "
          f"kubernetes_asyncio {library_took:.2f}s (lease {LEASE_DURATION}s)")
