"""What the Deployment runs, run here: ``muster run --config config/manager/muster.yaml``
as a separate process against the API sandbox, with the ports moved by ``MUSTER_*`` variables
(as a pod's env would). The probe endpoints answer, metrics are served over HTTPS to an
authenticated and authorized scraper only (the sandbox answers the TokenReviews and
SubjectAccessReviews), logs are JSON lines
as the shipped config asks, SIGTERM (what the kubelet sends) stops it cleanly and releases
its Lease, and a bad config stops it at start-up naming the key.

With two replicas (two processes on one sandbox): exactly one leads and reconciles, the other
stands by ready; stopping the leader hands over within a retry period; a leader whose Lease
is taken away stops and exits 1 (the kubelet restarts it)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp

from sandbox import SandboxServer
from tests.deploy.manifests import CONFIG, ROOT
from tests.helpers import eventually

SHIPPED_CONFIG = CONFIG / "manager" / "muster.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(probe: int, metrics: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
    env.update(MUSTER_SERVER__PROBE_PORT=str(probe), MUSTER_SERVER__METRICS_PORT=str(metrics))
    env.update(extra)
    return env


async def _until_ok(session: aiohttp.ClientSession, url: str,
                    proc: asyncio.subprocess.Process) -> str:
    """The body of ``url`` once it answers 200 (fails after 30 s or if Muster exits)."""
    got = None
    for _ in range(300):
        got = await _get(session, url)
        if (got and got[0] == 200) or proc.returncode is not None:
            break
        await asyncio.sleep(0.1)
    assert got and got[0] == 200, f"{url} never answered 200: {got}"
    return got[1]


def _namespace(server: SandboxServer) -> None:
    # What `kubectl apply -k config/default` creates first; the Lease lives there.
    server.store.create("namespaces", {"metadata": {"name": "muster-system"}})
    # Who may scrape /metrics: Prometheus' ServiceAccount, bound to muster-metrics-reader.
    server.tokens[PROMETHEUS_TOKEN] = PROMETHEUS
    server.tokens[OTHER_TOKEN] = {"username": "system:serviceaccount:team-a:default",
                                  "uid": "u-2", "groups": ["system:serviceaccounts"]}
    server.non_resource_grants.add((PROMETHEUS["username"], "get", "/metrics"))


PROMETHEUS_TOKEN, OTHER_TOKEN = "prometheus-token", "team-a-token"
PROMETHEUS = {"username": "system:serviceaccount:monitoring:prometheus", "uid": "u-1",
              "groups": ["system:serviceaccounts", "system:serviceaccounts:monitoring"]}


async def _scrape(session: aiohttp.ClientSession, port: int,
                  token: str | None) -> tuple[int, str] | None:
    """GET /metrics over HTTPS as Prometheus does (the certificate is self-signed)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with session.get(f"https://127.0.0.1:{port}/metrics", headers=headers,
                               ssl=False) as resp:
            return resp.status, await resp.text()
    except aiohttp.ClientError:
        return None


def _lease(server: SandboxServer) -> dict[str, object]:
    return dict(server.store.get("leases", "muster", "muster-system")["spec"])


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str] | None:
    try:
        async with session.get(url) as resp:
            return resp.status, await resp.text()
    except aiohttp.ClientError:
        return None


async def test_shipped_config_runs_probes_metrics_and_stops_on_sigterm(tmp_path: Path) -> None:
    probe, metrics = _free_port(), _free_port()
    async with SandboxServer(crd_dir=ROOT / "crds", seed=5) as server:
        _namespace(server)
        kc = server.write_kubeconfig(tmp_path / "kubeconfig")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "controller.cli", "run", "--config", str(SHIPPED_CONFIG),
            "--kubeconfig", str(kc), cwd=ROOT, env=_env(probe, metrics),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with aiohttp.ClientSession() as session:
                # Live first (served before the campaign), ready once leading and started.
                await _until_ok(session, f"http://127.0.0.1:{probe}/healthz", proc)
                ready = await _until_ok(session, f"http://127.0.0.1:{probe}/readyz", proc)
                assert json.loads(ready)["role"] == "leader"
                got = await _scrape(session, metrics, PROMETHEUS_TOKEN)
                assert got and got[0] == 200, got
                # The controller's registry (a gauge per phase) and the process collector.
                assert 'muster_requests{phase="Pending"} 0.0' in got[1], got[1]
                assert "process_resident_memory_bytes " in got[1], got[1]
                # Secure metrics: no token or an unknown one 401, a user without the
                # nonResourceURLs grant 403; only HTTPS; the probe port has no /metrics.
                for token, status in ((None, 401), ("forged", 401), (OTHER_TOKEN, 403)):
                    got = await _scrape(session, metrics, token)
                    assert got and got[0] == status, (token, got)
                assert await _get(session, f"http://127.0.0.1:{metrics}/metrics") is None
                assert (await _get(session, f"http://127.0.0.1:{probe}/metrics") or [0])[0] == 404
            checks = [r for r in server.reviews if r["kind"] == "SubjectAccessReview"]
            assert checks and checks[0]["spec"]["nonResourceAttributes"] == {
                "path": "/metrics", "verb": "get"}
            assert checks[0]["spec"]["user"] == PROMETHEUS["username"]
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), timeout=20)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.stdout is not None
        output = (await proc.stdout.read()).decode()
        released = _lease(server)
    assert code == 0, output
    assert released["holderIdentity"] == "", "a clean stop hands the Lease back"
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines, "Muster logged nothing"
    for line in lines:
        record = json.loads(line)  # log_format: json in the shipped config
        assert {"ts", "level", "msg"} <= record.keys()
    assert any("Muster is running" in json.loads(line)["msg"] for line in lines)
    assert not any("GET /healthz" in line for line in lines), "probes must not flood the log"


async def test_bad_config_stops_muster_at_start_up(tmp_path: Path) -> None:
    bad = tmp_path / "muster.yaml"
    bad.write_text(SHIPPED_CONFIG.read_text() + "booking:\n  duration_secs: 5\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controller.cli", "run", "--config", str(bad),
        "--kubeconfig", str(tmp_path / "none"), cwd=ROOT, env=_env(_free_port(), _free_port()),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2
    assert "duration_secs" in err.decode()


# Short durations so the scenarios take seconds; the shipped ones are 8/6/1 s.
FAST_ELECTION = {
    "MUSTER_LEADER_ELECTION__LEASE_DURATION_SECONDS": "10",
    "MUSTER_LEADER_ELECTION__RENEW_DEADLINE_SECONDS": "1",
    "MUSTER_LEADER_ELECTION__RETRY_PERIOD_SECONDS": "0.2",
    "MUSTER_LOG_FORMAT": "text",
}


class Replica:
    """One `muster run` process, as one pod of the Deployment."""

    def __init__(self, proc: asyncio.subprocess.Process, probe: int) -> None:
        self.proc = proc
        self.probe = probe

    async def readyz(self, session: aiohttp.ClientSession) -> tuple[int, dict[str, str]] | None:
        got = await _get(session, f"http://127.0.0.1:{self.probe}/readyz")
        return None if got is None else (got[0], json.loads(got[1]))

    async def stop(self) -> str:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        assert self.proc.stdout is not None
        return (await self.proc.stdout.read()).decode()


async def _replica(kubeconfig: Path, election: dict[str, str] = FAST_ELECTION) -> Replica:
    probe = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controller.cli", "run", "--config", str(SHIPPED_CONFIG),
        "--kubeconfig", str(kubeconfig), cwd=ROOT,
        env=_env(probe, _free_port(), **election),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    return Replica(proc, probe)


async def _wait_roles(session: aiohttp.ClientSession, replicas: list[Replica],
                     want: list[str], *, within: float = 30.0) -> float:
    """Wait until each replica's /readyz answers 200 with the wanted role; return when (loop
    time). Fails after ``within`` seconds showing the last answers."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: list[tuple[int, str] | None] = []
    while loop.time() < deadline:
        answers = [await r.readyz(session) for r in replicas]
        last = [None if a is None else (a[0], a[1]["role"]) for a in answers]
        if last == [(200, role) for role in want]:
            return loop.time()
        await asyncio.sleep(0.05)
    raise AssertionError(f"replicas never reached {want}: {last}")


async def test_two_replicas_one_leads_and_a_clean_stop_hands_over_fast(tmp_path: Path) -> None:
    async with SandboxServer(crd_dir=ROOT / "crds", seed=6) as server:
        _namespace(server)
        kc = server.write_kubeconfig(tmp_path / "kubeconfig")
        first = await _replica(kc)
        replicas = [first]
        try:
            async with aiohttp.ClientSession() as session:
                await _wait_roles(session, [first], ["leader"])
                second = await _replica(kc)
                replicas.append(second)
                # The standby is ready (a RollingUpdate may go on) but does not lead, and
                # keeps standing by while the leader renews.
                await _wait_roles(session, [first, second], ["leader", "standby"])
                await asyncio.sleep(1.5)
                await _wait_roles(session, [first, second], ["leader", "standby"], within=0.5)
                leader = _lease(server)["holderIdentity"]
                first.proc.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(first.proc.wait(), timeout=20) == 0
                stopped = asyncio.get_running_loop().time()
                took_over = await _wait_roles(session, [second], ["leader"])
                # Well within the 10 s lease duration: the old leader released the Lease.
                assert took_over - stopped < 5.0
            spec = _lease(server)
            assert spec["holderIdentity"] not in ("", leader)
            assert spec["leaseTransitions"] == 1
        finally:
            outputs = [await r.stop() for r in replicas]
    assert "released lease muster-system/muster" in outputs[0], outputs[0]
    assert "acquired lease muster-system/muster" in outputs[1], outputs[1]


async def test_a_leader_that_loses_its_lease_stops_and_exits_1(tmp_path: Path) -> None:
    async with SandboxServer(crd_dir=ROOT / "crds", seed=7) as server:
        _namespace(server)
        kc = server.write_kubeconfig(tmp_path / "kubeconfig")
        replica = await _replica(kc)
        try:
            async with aiohttp.ClientSession() as session:
                await _wait_roles(session, [replica], ["leader"])
            # Another holder appears (an operator's kubectl, a split-brain): Muster must stop.
            server.store.patch("leases", "muster", {"spec": {"holderIdentity": "intruder"}},
                               "muster-system")
            code = await asyncio.wait_for(replica.proc.wait(), timeout=20)
        finally:
            output = await replica.stop()
    assert code == 1, output
    assert "lost lease muster-system/muster: the lease now names intruder" in output
    assert "error: lost the lease muster-system/muster" in output
    assert "released lease" not in output, "a lost Lease is not ours to release"


async def test_a_killed_leader_is_replaced_within_the_lease_duration_and_a_retry(
    tmp_path: Path,
) -> None:
    # The shipped durations (8/6/1 s): SIGKILL gives no chance to release the Lease, so the
    # standby takes over once it has seen the record unchanged for the lease duration; it
    # must do so then, not a jittered retry or two later, and never before the old leader's
    # renew deadline has passed.
    shipped = {"MUSTER_LOG_FORMAT": "text"}
    async with SandboxServer(crd_dir=ROOT / "crds", seed=8) as server:
        _namespace(server)
        kc = server.write_kubeconfig(tmp_path / "kubeconfig")
        first = await _replica(kc, shipped)
        replicas = [first]
        try:
            async with aiohttp.ClientSession() as session:
                await _wait_roles(session, [first], ["leader"])
                second = await _replica(kc, shipped)
                replicas.append(second)
                await _wait_roles(session, [first, second], ["leader", "standby"])
                renewed = _lease(server)["renewTime"]

                async def renewed_again() -> bool:
                    return _lease(server)["renewTime"] != renewed

                await eventually(renewed_again, within=5, step=0.01)  # just after a renewal
                first.proc.kill()
                killed = asyncio.get_running_loop().time()
                took_over = await _wait_roles(session, [second], ["leader"], within=30)
        finally:
            outputs = [await r.stop() for r in replicas]
            print(outputs[-1][-3000:])
    taken = took_over - killed
    print(f"killed leader replaced after {taken:.2f}s")
    # Lower bound: the lease duration from the standby's sight of the last renewal (it may
    # have seen it up to a jittered retry late, never early). Upper: plus that retry.
    assert 8.0 - 0.5 <= taken <= 8.0 + 2.2 + 1.0, f"took over after {taken:.1f}s"
