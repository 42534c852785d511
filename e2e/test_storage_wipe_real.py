"""etcd wiped under a running kube-apiserver, on a control plane of this test's own.

kube-apiserver is not restarted: its watch cache keeps the objects and resourceVersions of
the old etcd, while writes reach the new one, whose revisions start again. Re-listing cannot
rebuild Muster's view from such a server, so /readyz must fail, saying what happened and that
kube-apiserver needs a restart. The wipe destroys CRDs and RBAC, hence a cluster beside the
tier's (its own ports and state), with only what the controller needs installed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.commands.probes import Probes
from controller.common.clock import ManualClock
from controller.config import MusterConfig
from controller.kube import KubeClient
from controller.kube.resources import NAMESPACES, NODES
from controller.operator import Controller
from controller.runtime.leader import LeaderElector
from e2e import cluster as cp
from providers.fake import FakeProvider
from tests.cluster_objects import gpu_node
from tests.helpers import eventually

pytestmark = [pytest.mark.real, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[1]
READYZ_WITHIN = 30.0
"""Seconds from the wipe (etcd serving again) to a failing /readyz."""
MENDED_WITHIN = 45.0
"""Seconds from kube-apiserver (restarted) and the CRDs (installed again) to a ready Muster
that no longer sees the wiped objects."""


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cp.Cluster]:
    """A bare control plane beside the tier's, with Muster's CRDs."""
    base = cp.session_cluster().ports.base + 40
    cluster = cp.Cluster(state=tmp_path_factory.mktemp("wipe-cluster"), ports=cp.Ports(base))
    try:
        cp.up(cluster, bare=True)
        _install_crds(cluster)
    except cp.ClusterError as exc:
        cp.down(cluster, quiet=True)
        pytest.fail(f"the control plane did not start: {exc}", pytrace=False)
    yield cluster
    cp.down(cluster)


def _install_crds(cluster: cp.Cluster) -> None:
    cp.kubectl(
        cluster,
        "apply",
        "--server-side",
        "-k",
        str(ROOT / "config" / "crds" / "provisioningrequest"),
    )
    cp.kubectl(cluster, "apply", "--server-side", "-f", str(ROOT / "crds"))
    cp.kubectl(
        cluster,
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/provisioningrequests.autoscaling.x-k8s.io",
        "crd/capacitypools.muster.dev",
    )


async def test_etcd_wiped_under_a_running_api_server_fails_readyz(own: cp.Cluster) -> None:
    kube = await KubeClient.from_kubeconfig(own.admin_kubeconfig)
    controller = Controller(
        kube=kube,
        config=MusterConfig(),
        clock=ManualClock(start=datetime.now(UTC)),
        providers={"kind": FakeProvider(kube, heartbeat_seconds=3600)},
    )
    # Renewals ride out etcd's and kube-apiserver's restarts: the leader must stay the leader.
    elector = LeaderElector(
        kube,
        name="muster-wipe",
        namespace="default",
        identity="wipe-test",
        lease_duration_seconds=120,
        renew_deadline_seconds=90.0,
        retry_period_seconds=1.0,
    )
    probes = Probes(controller, elector)
    try:
        await elector.acquire()
        await kube.create(NAMESPACES, {"metadata": {"name": "before-wipe"}})
        await kube.create(NODES, gpu_node("before-wipe"))
        await controller.start()

        async def node_seen() -> bool:
            return controller.state.objects.node_exists("before-wipe")

        await eventually(node_seen, within=10)
        assert probes.ready()[0], probes.ready()
        before = int((await kube.list(NAMESPACES))["metadata"]["resourceVersion"])

        await asyncio.to_thread(cp.wipe_etcd, own)
        wiped_at = time.monotonic()

        # No create of ours: the leader's next renewal finds no Lease in the new etcd
        # (a get reads etcd, not the watch cache) and creates it there.
        async def not_ready() -> bool:
            return not probes.ready()[0]

        await eventually(not_ready, within=READYZ_WITHIN - (time.monotonic() - wiped_at), step=0.2)
        failed_after = time.monotonic() - wiped_at
        reason = probes.ready()[1]["reason"]
        assert reason.startswith(
            "the API server's storage went back in time: creating a Lease answered resourceVersion "
        ), reason
        assert reason.endswith(
            "restart kube-apiserver so its cache is rebuilt from etcd, and Muster re-lists"
        ), reason
        # What the message says of kube-apiserver: a fresh list still serves the old world,
        # at the old resourceVersion (so re-listing cannot rebuild the view).
        after = await kube.list(NAMESPACES)
        names = {ns["metadata"]["name"] for ns in after["items"]}
        assert "before-wipe" in names and int(after["metadata"]["resourceVersion"]) >= before, (
            after["metadata"],
            sorted(names),
        )
        print(
            f"\nlist resourceVersion before the wipe {before}, after "
            f"{after['metadata']['resourceVersion']}; 'before-wipe' listed after: "
            f"{'before-wipe' in names}; readyz failed {failed_after:.1f}s after the wipe: {reason}"
        )

        # The fix the message gives: kube-apiserver restarted (and, etcd being empty,
        # Muster's CRDs installed again) rebuilds its cache, and Muster's view with it.
        restarted_at = time.monotonic()
        await asyncio.to_thread(cp.restart_apiserver, own)
        await asyncio.to_thread(_install_crds, own)

        async def mended() -> bool:
            return probes.ready()[0] and not controller.state.objects.node_exists("before-wipe")

        await eventually(mended, within=MENDED_WITHIN, step=0.5)
        print(f"ready again {time.monotonic() - restarted_at:.0f}s after the restart began")
    finally:
        await controller.stop()
        await elector.release()
        await kube.close()
