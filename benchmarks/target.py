"""Where a benchmark runs: a fresh API sandbox, or a real cluster (``--kubeconfig``).

On a real cluster a benchmark shares the API server with whatever else runs there. It marks
what it creates with one run id: its own namespace ``bench-<run>``, ``-<run>`` at the end of
every cluster-scoped name, and the label ``bench.muster.dev/run=<run>`` on its pools' node
template and on the nodes it makes itself (its pod templates select that label, so Muster
plans on the run's nodes only). :meth:`Target.cleanup` removes all of it while Muster's
controller still runs, so every finalizer is served: the namespaced objects that own nodes
first (deleting a request releases its nodes), then the cluster-scoped objects in reverse
order of creation (a CapacityPool goes once its nodes are released), then the namespace; it
waits until no node of the run is left, and says what it had to force.

The benchmark's own reads and writes use ``--kubeconfig``; Muster's controller may use another
(``--muster-kubeconfig``, e.g. the ServiceAccount one of ``python3 -m e2e.cluster up``), so
the API server's RBAC and priority and fairness treat it as they treat Muster in production
(an admin certificate is ``system:masters``, whose requests API priority and fairness never
queue). Muster's client has no client-side rate limit (client-go's default is 5 QPS), so
what throttles it on a real cluster is the server: :func:`apf_snapshot` reads the API
server's flow-control counters before and after the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from controller.kube import ApiError, Body, KubeClient
from controller.kube.resources import LEASES, NAMESPACES, NODES, Resource

RUN_LABEL = "bench.muster.dev/run"
LEADER_LEASE = "muster"


@dataclass
class Target:
    """One benchmark run's cluster and the objects it created there."""

    kube: KubeClient
    """The benchmark's client (``--kubeconfig``, or the sandbox's)."""
    real: bool
    run: str
    kubeconfig: Path
    muster_kubeconfig: Path
    created: list[tuple[Resource, str]] = field(default_factory=list)
    """Cluster-scoped objects created, in order (removed in reverse)."""

    @property
    def namespace(self) -> str:
        return f"bench-{self.run}"

    @property
    def selector(self) -> dict[str, str]:
        return {RUN_LABEL: self.run}

    def name(self, base: str) -> str:
        return f"{base}-{self.run}"

    async def create(self, res: Resource, body: Body) -> Body:
        """Create a cluster-scoped object and remember it for :meth:`cleanup`."""
        made = await self.kube.create(res, body)
        self.created.append((res, str(body["metadata"]["name"])))
        return made

    async def muster_client(self) -> KubeClient:
        """A client for Muster's controller: its own connections, as a separate process
        would have."""
        return await KubeClient.from_kubeconfig(self.muster_kubeconfig)

    async def cleanup(self, owners: Sequence[Resource], *, within: float = 300.0) -> str:
        """Remove everything this run created (see the module). ``owners``: namespaced kinds
        whose deletion releases nodes, deleted first and waited for. Returns a summary."""
        started = time.monotonic()
        kube, ns = self.kube, self.namespace
        deadline = started + within
        counts: dict[str, int] = {}
        forced: list[str] = []
        for res in owners:
            items = (await kube.list(res, namespace=ns)).get("items") or []
            counts[res.plural] = len(items)
            await _each([i["metadata"]["name"] for i in items],
                        functools.partial(kube.delete, res, namespace=ns))
            if not await _until(functools.partial(_none_left, kube, res, ns), deadline):
                forced.append(f"{res.plural} whose finalizers never ran")
                await _strip_finalizers(kube, res, ns)
        for res, name in reversed(self.created):
            await kube.delete(res, name)
            if not await _until(functools.partial(_gone, kube, res, name), deadline):
                forced.append(f"{res.plural}/{name}")
                await _strip_finalizers(kube, res, None, name)
        selector = f"{RUN_LABEL}={self.run}"
        nodes = await _until(lambda: _none_labelled(kube, selector), deadline)
        if not nodes:
            left = (await kube.list(NODES, label_selector=selector)).get("items") or []
            forced.append(f"{len(left)} node(s) Muster did not release")
            await _each([n["metadata"]["name"] for n in left],
                        lambda n: kube.delete(NODES, n))
            await _until(lambda: _none_labelled(kube, selector), time.monotonic() + 60)
        await kube.delete(NAMESPACES, ns)
        if not await _until(lambda: _gone(kube, NAMESPACES, ns), time.monotonic() + 120):
            forced.append(f"namespace {ns} still terminating")
        removed = ", ".join(f"{n} {plural}" for plural, n in counts.items())
        summary = (f"cleanup: removed {removed}, {len(self.created)} cluster-scoped objects, "
                   f"the run's nodes and namespace {ns} in {time.monotonic() - started:.1f}s")
        if forced:
            summary += "; FORCED: " + "; ".join(forced)
        return summary


def add_target_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """``--kubeconfig`` and ``--muster-kubeconfig``, the same in every benchmark."""
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help=f"run against this cluster{what} (own namespace, and everything "
                        "else the run makes, all removed at the end) instead of a sandbox")
    parser.add_argument("--muster-kubeconfig", type=Path, default=None,
                        help="with --kubeconfig: the controller's credentials (default: "
                        "--kubeconfig's), e.g. .cluster/muster.kubeconfig")


@contextlib.asynccontextmanager
async def target(args: argparse.Namespace,
                 sandbox: Callable[[], AbstractAsyncContextManager[Path]]
                 ) -> AsyncIterator[Target]:
    """The cluster of ``--kubeconfig``, or a fresh sandbox (``sandbox()`` yields its
    kubeconfig)."""
    if args.kubeconfig:
        async with open_target(args.kubeconfig, real=True,
                               muster_kubeconfig=args.muster_kubeconfig) as t:
            yield t
        return
    async with sandbox() as path, open_target(path, real=False) as t:
        yield t


@contextlib.asynccontextmanager
async def open_target(kubeconfig: Path, *, real: bool,
                      muster_kubeconfig: Path | None = None) -> AsyncIterator[Target]:
    """A run on the cluster (or sandbox) of ``kubeconfig``, with its namespace made. On a
    real cluster it refuses to start next to a running Muster: two controllers would serve
    the same requests."""
    kube = await KubeClient.from_kubeconfig(kubeconfig)
    try:
        if real:
            await refuse_other_muster(kube)
        target = Target(kube=kube, real=real, run=uuid.uuid4().hex[:6], kubeconfig=kubeconfig,
                        muster_kubeconfig=muster_kubeconfig or kubeconfig)
        await kube.create(NAMESPACES, {"metadata": {"name": target.namespace,
                                                    "labels": target.selector}})
        yield target
    finally:
        await kube.close()


async def refuse_other_muster(kube: KubeClient) -> None:
    """Raise if a Muster holds its leader Lease (named ``muster``) in any namespace."""
    now = datetime.now(UTC)
    for lease in (await kube.list(LEASES)).get("items") or []:
        meta, spec = lease["metadata"], lease.get("spec") or {}
        if meta["name"] != LEADER_LEASE or not spec.get("holderIdentity"):
            continue
        renewed = spec.get("renewTime")
        if not renewed:
            continue
        age = (now - datetime.fromisoformat(renewed.replace("Z", "+00:00"))).total_seconds()
        if age < float(spec.get("leaseDurationSeconds") or 15):
            raise SystemExit(
                f"a Muster ({spec['holderIdentity']}) leads on this cluster (Lease "
                f"{meta['namespace']}/{meta['name']}, renewed {age:.0f}s ago): the benchmark "
                "runs its own controller, and two would serve the same requests; stop it first"
            )


async def apf_snapshot(kubeconfig: Path) -> dict[str, list[float]] | None:
    """API priority and fairness per priority level: [dispatched, summed queue wait in s,
    rejected], from the API server's /metrics (None when it cannot be read)."""
    proc = await asyncio.create_subprocess_exec(
        "kubectl", f"--kubeconfig={kubeconfig}", "get", "--raw", "/metrics",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        return None
    levels: dict[str, list[float]] = {}
    wanted = {
        "apiserver_flowcontrol_dispatched_requests_total": 0,
        "apiserver_flowcontrol_request_wait_duration_seconds_sum": 1,
        "apiserver_flowcontrol_rejected_requests_total": 2,
    }
    for line in out.decode().splitlines():
        m = _METRIC.match(line)
        if m is None or m["name"] not in wanted:
            continue
        labels = m["labels"]
        if m["name"].endswith("_sum") and 'execute="true"' not in labels:
            continue
        level = _LEVEL.search(labels)
        if level is None:
            continue
        levels.setdefault(level[1], [0.0, 0.0, 0.0])[wanted[m["name"]]] += float(m["value"])
    return levels


def apf_report(before: dict[str, list[float]] | None,
               after: dict[str, list[float]] | None) -> str:
    """What API priority and fairness did during the run, per priority level that served
    requests."""
    if before is None or after is None:
        return "API priority and fairness: /metrics not readable (kubectl missing or refused)"
    parts = []
    for level, (dispatched, wait, rejected) in sorted(after.items()):
        d0, w0, r0 = before.get(level, [0.0, 0.0, 0.0])
        n = dispatched - d0
        if n <= 0 and rejected - r0 <= 0:
            continue
        mean_ms = 1000 * (wait - w0) / n if n > 0 else 0.0
        parts.append(f"{level}: {int(n)} dispatched, mean queue wait {mean_ms:.2f} ms, "
                     f"{int(rejected - r0)} rejected (429)")
    return "API priority and fairness: " + ("; ".join(parts) or "no requests")


_METRIC = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LEVEL = re.compile(r'priority_level="([^"]+)"')


async def _each(names: list[str], act: Callable[[str], Awaitable[object]]) -> None:
    limit = asyncio.Semaphore(32)

    async def one(name: str) -> None:
        async with limit:
            with contextlib.suppress(ApiError):
                await act(name)

    await asyncio.gather(*(one(n) for n in names))


async def _until(probe: Callable[[], Awaitable[bool]], deadline: float) -> bool:
    while True:
        if await probe():
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)


async def _none_left(kube: KubeClient, res: Resource, namespace: str) -> bool:
    return not (await kube.list(res, namespace=namespace)).get("items")


async def _none_labelled(kube: KubeClient, selector: str) -> bool:
    return not (await kube.list(NODES, label_selector=selector)).get("items")


async def _gone(kube: KubeClient, res: Resource, name: str) -> bool:
    return await kube.get_or_none(res, name) is None


async def _strip_finalizers(kube: KubeClient, res: Resource, namespace: str | None,
                            name: str | None = None) -> None:
    items = ([await kube.get_or_none(res, name)] if name
             else (await kube.list(res, namespace=namespace)).get("items") or [])
    for item in items:
        if item is not None and item["metadata"].get("finalizers"):
            with contextlib.suppress(ApiError):
                await kube.merge_patch(res, item["metadata"]["name"],
                                       {"metadata": {"finalizers": None}}, namespace=namespace)
