"""The HTTP endpoints of ``muster run``: ``/healthz`` (liveness), ``/readyz`` (readiness) and
``/metrics`` (Prometheus text; with ``server.metrics_secure``, HTTPS on its own port and
only for authenticated, authorized scrapers: :mod:`controller.commands.metrics_auth`).

- ``/healthz`` answers 200 while the process works: the event loop serves the request (a
  blocked loop fails the probe by timing out) and none of the controller's long-running tasks
  (reconcile workers, watches, collector, Kueue) has died. A standby replica is live.
  503 lists the dead tasks; the kubelet then restarts the container.
- ``/readyz`` answers 200 when the replica does what its role asks: the leader once the
  controller has started (caches synced, start-up collection done, reconciles running) and
  while its watches make progress, a standby while its last attempt on the Lease reached the
  API server. 503 otherwise: the leader still starting or with a stalled watch, a standby
  that cannot reach the Lease, or a replica shutting down or that lost the Lease. A stalled
  watch is listed in /healthz too, without failing it (a restart cannot bring back an API
  server that is down, and the watch re-lists by itself). So is an API server whose storage
  went back in time under it (etcd wiped or restored while kube-apiserver ran): its watch
  cache keeps serving the old objects, and /readyz says to restart kube-apiserver.

Standbys are *ready*, like controller-runtime's managers (their readyz checks know nothing
of leader election). Nothing routes traffic to Muster, so readiness only gates rollouts:
with a RollingUpdate, the new pod comes up as a standby while the old leader still holds
the Lease, and the old pod is only stopped (handing the Lease over) once the new one is
ready. Were standbys not ready, that rollout would wait forever. Who leads is in the body
(``role``) and in ``muster_leader`` on ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client.core import GaugeMetricFamily, Metric

from controller.commands.metrics_auth import MetricsAuth
from controller.common.metrics import CONTENT_TYPE
from controller.operator import Controller
from controller.runtime.leader import LeaderElector


class Probes:
    def __init__(self, controller: Controller, elector: LeaderElector | None) -> None:
        self.controller = controller
        self.elector = elector
        self.stopping = False
        """Set by ``muster run`` once it shuts down (signal, lost Lease, failed start)."""
        controller.metrics.registry.register(self)

    @property
    def role(self) -> str:
        if self.elector is None:
            return "single"  # leader election off: this replica acts unconditionally
        return "leader" if self.elector.is_leader else "standby"

    def live(self) -> tuple[bool, dict[str, Any]]:
        dead = self.controller.failed_tasks()
        body: dict[str, Any] = {"role": self.role, **self.controller.health()}
        if dead:
            body["dead_tasks"] = dead
        stalled = self.controller.stalled_watches()
        if stalled:
            # Reported, not fatal: a stalled watch re-lists by itself, and a restart cannot
            # bring back an API server that is down.
            body["stalled_watches"] = stalled
        if self.controller.kube.storage_regressed:
            body["storage_regressed"] = self.controller.kube.storage_regressed
        return not dead, body

    def ready(self) -> tuple[bool, dict[str, Any]]:
        role = self.role
        body: dict[str, Any] = {"role": role}
        if self.stopping:
            ok, body["reason"] = False, "shutting down"
        elif self.elector is not None and role == "standby":
            error = self.elector.last_error
            ok = error is None
            body["reason"] = (f"standing by; lease held by {self.elector.holder or 'nobody'}"
                              if ok else f"cannot reach the lease: {error}")
        elif self.controller.ready and (regressed := self.controller.kube.storage_regressed):
            # The view is stale and re-listing serves the same stale cache: only a
            # kube-apiserver restart mends it (see KubeClient._check_write).
            ok, body["reason"] = False, regressed
        elif self.controller.ready and (stalled := self.controller.stalled_watches()):
            # Says the threshold each watch was judged by (a failing one is stalled sooner).
            ok, body["reason"] = False, "; ".join(self.controller.stall_reasons())
            body["stalled_watches"] = stalled
        elif self.controller.ready:
            ok, body["reason"] = True, "reconciling"
        else:
            ok, body["reason"] = False, "starting: caches syncing and start-up collection"
        return ok, body

    def metrics(self) -> bytes:
        """The controller's Prometheus registry, ``muster_leader`` and ``muster_ready``
        included."""
        return self.controller.metrics.exposition()

    def collect(self) -> Iterator[Metric]:
        """Prometheus collector (registered on the controller's registry)."""
        yield GaugeMetricFamily("muster_leader", "1 when this replica acts (leads, or leader "
                                "election is off), 0 while standing by.",
                                value=int(self.role in ("leader", "single")))
        yield GaugeMetricFamily("muster_ready", "1 when /readyz answers 200.",
                                value=int(self.ready()[0]))

    def app(self, *, probes: bool = True, metrics: bool = True,
            auth: MetricsAuth | None = None) -> web.Application:
        """The probe endpoints, ``/metrics``, or both; with ``auth`` every ``/metrics``
        request is authenticated and authorized first (see :mod:`metrics_auth`)."""

        async def healthz(_: web.Request) -> web.Response:
            ok, body = self.live()
            return web.json_response(body, status=200 if ok else 503)

        async def readyz(_: web.Request) -> web.Response:
            ok, body = self.ready()
            return web.json_response(body, status=200 if ok else 503)

        async def metrics_(request: web.Request) -> web.Response:
            if auth is not None:
                refused = await auth.check(request)
                if refused is not None:
                    return refused
            return web.Response(body=self.metrics(), headers={"Content-Type": CONTENT_TYPE})

        app = web.Application()
        if probes:
            app.router.add_get("/healthz", healthz)
            app.router.add_get("/readyz", readyz)
        if metrics:
            app.router.add_get("/metrics", metrics_)
        return app
