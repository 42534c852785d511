"""Runs Muster's admission check: list-then-watch loops over the Kueue objects it needs,
its own ProvisioningRequests and the CapacityPools, and a keyed work queue of Workloads.

Started by :class:`controller.operator.Controller` when ``kueue.enabled`` is set.
A Workload is reconciled when it changes, when one of its requests changes, and when an
AdmissionCheck, ResourceFlavor or ProvisioningRequestConfig changes (all Workloads then,
since which check a Workload uses is in its status).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controller.common.clock import Clock
from controller.common.topology_defaults import DEFAULT_LEVELS, HOSTNAME, POOL_LABEL
from controller.config import KueueConfig
from controller.kube import ApiError, Body, KubeClient, WatchEvent, whole_listing
from controller.kube.events import EventBroadcaster, EventRecorder
from controller.kube.resources import CAPACITY_POOLS, NODES, PROVISIONING_REQUESTS, Resource
from controller.kueue.drafts import MANAGED_LABEL, workload_of
from controller.kueue.facts import StateFacts, WatchedFacts
from controller.kueue.models import Topology
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
    TOPOLOGIES,
    WORKLOADS,
)
from controller.kueue.workloads import CheckReconciler, KueueCache
from controller.runtime.problems import ProblemLog, describe, retrying, transient
from controller.runtime.workqueue import WorkQueue
from controller.state.cache import ClusterState
from controller.state.requests import RequestRecord

log = logging.getLogger(__name__)
_problems = ProblemLog(log)

EVENT_COMPONENT = "muster-admission-check"
"""The source of Events on Workloads (the request controller's is ``muster``)."""


class KueueNotInstalled(RuntimeError):
    """kueue.enabled is set on a cluster that does not serve Kueue's v1beta2 API."""


def _key(obj: Body) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class KueueIntegration:
    def __init__(
        self,
        *,
        kube: KubeClient,
        config: KueueConfig,
        clock: Clock,
        levels: Sequence[str] = DEFAULT_LEVELS,
        state: ClusterState | None = None,
        concurrency: int = 32,
        events: EventRecorder | None = None,
    ) -> None:
        self.kube = kube
        # Standalone (tests, benchmarks) it posts through a broadcaster of its own; inside
        # the Controller it shares the controller's.
        self._own_events: EventBroadcaster | None = None
        if events is None:
            self._own_events = EventBroadcaster(kube, now=clock.now)
            events = self._own_events.recorder(EVENT_COMPONENT)
        self.config = config
        self.levels = tuple(levels)
        self.topology_warnings: dict[str, str] = {}
        """Topology name -> why nodes Muster provisions would not fit it (also logged)."""
        self._topologies: dict[str, Body] = {}
        self.cache = KueueCache()
        self.reconciler = CheckReconciler(kube=kube, cache=self.cache, config=config, clock=clock,
                                          events=events)
        self.queue = WorkQueue(self._reconcile, clock=clock, concurrency=concurrency)
        self._tasks: list[asyncio.Task[None]] = []
        self._synced: dict[str, asyncio.Event] = {}
        self._watched = WatchedFacts()
        self._request_sigs: dict[str, str | None] = {}
        self.reconciles = 0
        """Workload reconciles run (for the benchmark)."""
        self._own_pool_watch = state is None
        self.cache.facts = StateFacts(state) if state is not None else self._watched
        self._serves_topologies = False

    async def _reconcile(self, key: str) -> float | None:
        self.reconciles += 1
        return await self.reconciler.reconcile_workload(key)

    # ------------------------------------------------------------------ life cycle

    async def start(self, *, sync_timeout: float | None = None) -> None:
        """Preflight (transient errors retried), watches, then wait for their first lists
        (which the watches retry; ``sync_timeout`` None: as long as it takes)."""
        await retrying(self.preflight, "checking Kueue's API", _problems)
        c = self.cache
        self._watch(ADMISSION_CHECKS, c.checks, self._checks_changed)
        self._watch(RESOURCE_FLAVORS, c.flavors, self._all_workloads)
        self._watch(PROVISIONING_REQUEST_CONFIGS, c.configs, self._checks_changed)
        if self._own_pool_watch:
            self._watch(CAPACITY_POOLS, self._watched.pool_bodies, self._pools_changed)
            self._watch(NODES, {}, None, on_node=True)
        self._watch(PROVISIONING_REQUESTS, c.requests, self._request_changed,
                    label_selector=MANAGED_LABEL, parse=RequestRecord.parse)
        self._watch(WORKLOADS, c.workloads, self._workload_changed)
        if self._serves_topologies:
            self._watch(TOPOLOGIES, self._topologies, self._topologies_changed)
        await asyncio.wait_for(
            asyncio.gather(*(e.wait() for e in self._synced.values())), timeout=sync_timeout
        )
        if self._own_events is not None:
            self._own_events.start()
        self.queue.start()
        await self._checks_changed(None)

    async def preflight(self) -> None:
        """Fail fast, naming the fix, when the cluster does not serve Kueue's v1beta2 API
        (otherwise the watches would retry forever and no Workload would ever move)."""
        for res in (WORKLOADS, ADMISSION_CHECKS):
            try:
                await self.kube.list(res)
            except ApiError as exc:
                if exc.not_found:
                    raise KueueNotInstalled(
                        f"kueue.enabled is set but {res.plural}.{res.group}/{res.version} is "
                        "not served: install Kueue v0.15 or later (v1beta2 API), or set "
                        "kueue.enabled=false"
                    ) from None
                raise
        try:
            await self.kube.list(TOPOLOGIES)
            self._serves_topologies = True
        except ApiError as exc:
            if not exc.not_found:
                raise
            self._serves_topologies = False

    def _topologies_changed(self, _: Body | None) -> None:
        warnings = {}
        for name, body in self._topologies.items():
            try:
                topo = Topology.model_validate(body)
            except ValueError:
                continue
            missing = [lv for lv in topo.level_labels
                       if lv not in self.levels and lv != HOSTNAME]
            if missing:
                warnings[name] = (
                    f"Topology {name}: level(s) {', '.join(missing)} are not in Muster's "
                    f"topology.levels ({', '.join(self.levels)}); nodes Muster provisions "
                    "will not carry them and Kueue TAS cannot place pods there"
                )
                continue
            unlabelled = self._pools_missing(topo.level_labels)
            if unlabelled:
                warnings[name] = (
                    f"Topology {name}: CapacityPool domain(s) without a value for its "
                    f"levels: {'; '.join(unlabelled[:5])}; nodes provisioned there lack those "
                    "labels and Kueue TAS cannot place pods on them"
                )
        for name, text in warnings.items():
            if self.topology_warnings.get(name) != text:
                log.warning("%s", text)
        self.topology_warnings = warnings

    def _pools_missing(self, levels: Sequence[str]) -> list[str]:
        wanted = [lv for lv in levels if lv != HOSTNAME]
        out = []
        for pool, i, labels in self.cache.facts.domains():
            lacking = [lv for lv in wanted if lv not in labels]
            if lacking:
                out.append(f"CapacityPool {pool} spec.topology.domains[{i}] lacks "
                           f"{', '.join(lacking)}")
        return out

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The watch and worker tasks (for liveness)."""
        return [*self._tasks, *self.queue.tasks]

    def halt(self) -> None:
        """Stop every Workload reconcile now, without waiting (leadership lost)."""
        self.queue.halt()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.queue.stop()
        if self._own_events is not None:
            await self._own_events.stop()

    def _watch(
        self,
        res: Resource,
        store: dict[str, Any],
        changed: Callable[[Body | None], Any] | None,
        *,
        label_selector: str | None = None,
        on_node: bool = False,
        parse: Callable[[Body, Any], Any] | None = None,
    ) -> None:
        """Keep ``store`` (key -> object, or what ``parse(object, previous)`` makes of it)
        in step with ``res``; ``changed`` is told of each change."""
        synced = self._synced.setdefault(res.plural, asyncio.Event())

        async def on_sync(items: list[Body]) -> None:
            if on_node:
                self._watched.node_pools = {
                    n["metadata"]["name"]: n["metadata"]["labels"][POOL_LABEL]
                    for n in items if (n["metadata"].get("labels") or {}).get(POOL_LABEL)
                }
            else:
                fresh = {_key(i): parse(i, store.get(_key(i))) if parse else i for i in items}
                store.clear()
                store.update(fresh)
            synced.set()
            if changed is not None and synced.is_set():
                await _maybe(changed(None))

        async def on_event(ev: WatchEvent) -> None:
            obj = ev.object
            if on_node:
                name = obj["metadata"]["name"]
                pool = (obj["metadata"].get("labels") or {}).get(POOL_LABEL)
                if ev.type == "DELETED" or not pool:
                    self._watched.node_pools.pop(name, None)
                else:
                    self._watched.node_pools[name] = pool
                return
            key = _key(obj)
            if ev.type == "DELETED":
                store.pop(key, None)
            else:
                store[key] = parse(obj, store.get(key)) if parse else obj
            if changed is not None:
                await _maybe(changed(obj))

        self._tasks.append(asyncio.create_task(
            self.kube.watch(res, whole_listing(on_sync), on_event, label_selector=label_selector),
            name=f"kueue-watch-{res.plural}",
        ))

    # ------------------------------------------------------------------ change fan-out

    def _ready(self) -> bool:
        return all(e.is_set() for e in self._synced.values())

    def _workload_changed(self, obj: Body | None) -> None:
        if obj is None:
            self._all_workloads(None)
            return
        key = _key(obj)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv is not None and self.reconciler.written.get(key) == rv:
            return  # the echo of our own status write: already reconciled
        if self._ready():
            self.queue.add(key)

    def _all_workloads(self, _: Body | None) -> None:
        if self._ready():
            for key in list(self.cache.workloads):
                self.queue.add(key)

    async def _checks_changed(self, _: Body | None) -> None:
        if not self._ready():
            return
        for name, body in list(self.cache.checks.items()):
            if self.reconciler.ours(body):
                try:
                    await self.reconciler.reconcile_check(name)
                except Exception as exc:
                    if not transient(exc):
                        log.exception("AdmissionCheck %s: setting Active failed", name)
                        continue
                    _problems.warning("check", "AdmissionCheck %s: setting Active failed "
                                      "(%s); retried on its next change", name, describe(exc))
        self._all_workloads(None)

    def _request_changed(self, obj: Body | None) -> None:
        if obj is None:
            self._request_sigs.clear()
            self._all_workloads(None)
            return
        key = _key(obj)
        current = self.cache.requests.get(key)
        sig = None if current is None else _signature(current.body)
        if key in self._request_sigs and self._request_sigs[key] == sig:
            return  # e.g. the request reconciler's own bookkeeping annotations
        if sig is None:
            self._request_sigs.pop(key, None)
        else:
            self._request_sigs[key] = sig
        ns = obj["metadata"].get("namespace")
        workload, _ = workload_of(obj)
        if workload and self._ready():
            self.queue.add(f"{ns}/{workload}")

    def _pools_changed(self, _: Body | None) -> None:
        self._topologies_changed(None)


def _signature(request: Mapping[str, Any]) -> str:
    """What of a request the check reacts to: its conditions, class details and deletion."""
    status = request.get("status") or {}
    return json.dumps([
        [(c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
         for c in status.get("conditions") or []],
        status.get("provisioningClassDetails") or {},
        (request.get("metadata") or {}).get("deletionTimestamp"),
    ], sort_keys=True)


async def _maybe(value: Any) -> None:
    if asyncio.iscoroutine(value):
        await value
