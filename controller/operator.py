"""Wiring: one :class:`Controller` owns the cache, its watches, the planner, the work queue,
the service, the collector, the event broadcaster and its metrics registry, and starts and
stops them in the right order. Every kind it reads, ProvisioningRequests included, comes from
:class:`controller.state.feeds.Feeds` (Muster's own list-then-watch loops).

Start-up order matters for correctness after a crash: the cache syncs (nodes, pods,
templates, pools and requests) before the orphan collector runs, and the collector runs
before any reconcile, so it sees every persisted key and a resumed acquisition is never
mistaken for an orphan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from controller.acquire.collector import Collector
from controller.acquire.providers import ProviderSet
from controller.common.clock import Clock, RealClock
from controller.common.metrics import ControllerMetrics
from controller.config import MusterConfig
from controller.kube import ApiError, KubeClient
from controller.kube.events import DEFAULT_QUEUE_SIZE, EventBroadcaster
from controller.kube.resources import CAPACITY_POOLS, PROVISIONING_REQUESTS
from controller.kueue.integration import EVENT_COMPONENT as KUEUE_EVENTS
from controller.kueue.integration import KueueIntegration, KueueNotInstalled
from controller.podgroups.integration import EVENT_COMPONENT as GANG_EVENTS
from controller.podgroups.integration import PodGroupIntegration
from controller.reconcilers.pool_status import PoolStatusWriter
from controller.reconcilers.pools import sync_pool_finalizers
from controller.reconcilers.provisioning.service import ProvisioningService
from controller.reconcilers.telemetry import (
    RequestTelemetry,
    metered,
    planner_pass_observer,
    state_reading,
)
from controller.runtime.problems import LOG_INTERVAL, ProblemLog, describe, retrying, transient
from controller.runtime.workqueue import WorkQueue
from controller.state.cache import ClusterState
from controller.state.feeds import Feeds
from controller.state.planner import Planner
from controller.state.wakeups import Wakeups
from providers.base import Provider, ProviderConfigError
from providers.registry import ProviderContext

log = logging.getLogger(__name__)


WATCH_GRACE_SECONDS = 30.0
"""Beyond a watch stream's length, how long its re-list may take before it counts as
stalled."""

FAILING_WATCH_SECONDS = 20.0
"""A watch whose requests have failed (no answer, 5xx) without a single success for this
long counts as stalled too: an API server down for a minute shows on /readyz within
seconds, not after a whole stream's length."""

DRAIN_SECONDS = 10.0
"""How long stopping waits for API requests still unanswered (those of cancelled tasks)."""


class StartupError(Exception):
    """The controller cannot start; the message says why and what to do."""


class Controller:
    """Muster's ProvisioningRequest controller, runnable in any asyncio program."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        config: MusterConfig,
        clock: Clock | None = None,
        providers: Mapping[str, Provider] | None = None,
        event_queue_size: int = DEFAULT_QUEUE_SIZE,
    ) -> None:
        self.kube = kube
        self.config = config
        self.clock = clock or RealClock()
        self.collect_interval = config.acquisition.collect_interval_seconds
        self.state = ClusterState(levels=config.topology.levels, notify=self._enqueue,
                                  forget=self._forget)
        self.metrics = ControllerMetrics()
        """This controller's own registry: several controllers in one process never collide."""
        self.events = EventBroadcaster(kube, now=self.clock.now, queue_size=event_queue_size)
        self.providers = ProviderSet(
            ProviderContext(kube=kube, now=self.clock.now, cluster_name=config.cluster_name),
            settings={"kind": config.providers.kind.model_dump(), **config.providers.settings},
            instances=providers,
            metrics=self.metrics,
        )
        self.planner = Planner(self.state, now=self.clock.now,
                               on_pass=planner_pass_observer(self.metrics))
        self.service = ProvisioningService(
            kube=kube, state=self.state, planner=self.planner, providers=self.providers,
            config=config, clock=self.clock,
            on_transition=RequestTelemetry(recorder=self.events.recorder("muster"),
                                           metrics=self.metrics, now=self.clock.now),
            recorder=self.events.recorder("muster"),
        )
        self.queue = WorkQueue(
            metered(self.service.reconcile, self.metrics), clock=self.clock,
            concurrency=config.acquisition.max_concurrent_reconciles,
        )
        self.wakeups = Wakeups(clock=self.clock, waiting=self.service.waiting,
                               enqueue=self._enqueue,
                               max_per_second=config.retry.replan_max_per_second)
        if config.retry.replan_on_capacity_change:
            self.service.wakeups = self.wakeups
            self.state.capacity_changed = self.wakeups.poke
            self.state.shortage_set = lambda until: self.wakeups.poke_at(
                until, "stock-out window ended")
        self.metrics.watch_state(state_reading(
            state=self.state, served=lambda name: config.classes.mode_for(name) is not None,
            in_flight=lambda: len(self.service.in_flight), queue=self.queue, events=self.events,
        ))
        self.collector = Collector(
            state=self.state, providers=self.providers,
            idle_ttl=config.acquisition.idle_ttl_seconds,
            grace=config.acquisition.orphan_grace_seconds, now=self.clock.now,
            in_flight=self.service.in_flight.__contains__,
        )
        self.pool_status = PoolStatusWriter(
            kube=kube, state=self.state, providers=self.providers, config=config.pool_status,
            clock=self.clock, metrics=self.metrics,
        )
        self.feeds = Feeds(kube, self.state)
        self.kueue = (
            KueueIntegration(kube=kube, config=config.kueue, clock=self.clock,
                             levels=config.topology.levels, state=self.state,
                             events=self.events.recorder(KUEUE_EVENTS))
            if config.kueue.enabled else None
        )
        self.podgroups = (
            PodGroupIntegration(kube=kube, config=config.podgroups, clock=self.clock,
                                events=self.events.recorder(GANG_EVENTS))
            if config.podgroups.enabled else None
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.problems = ProblemLog(log)
        """Start-up and loop trouble, logged once per interval."""
        self.stall_after = kube.watch_timeout + WATCH_GRACE_SECONDS
        """A watch whose view has not moved for this long is stalled (/readyz says so): a
        healthy one gets an event, a bookmark or a fresh list at least once per stream."""
        self.failing_after = FAILING_WATCH_SECONDS
        """A watch failing for this long without progress is stalled as well."""
        self._started = False
        self.ready = False
        """True once :meth:`start` returned (caches synced, start-up collection done,
        reconciles running) until :meth:`halt` or :meth:`stop`: what /readyz reports."""

    def _enqueue(self, key: str) -> None:
        if self._started:
            self.queue.add(key)

    def _forget(self, key: str) -> None:
        # A deleted request's timers (booking expiry, retry backoff) would hold it for up to
        # a booking's duration.
        if hasattr(self, "queue"):
            self.queue.forget(key)

    async def start(self) -> None:
        """Start everything in order. A transient error on the way (no answer, 5xx, 429, a
        provider's retryable error) is retried with backoff, never fatal: only what needs
        someone to act (a missing CRD or Kueue, forbidden) stops start-up."""
        await retrying(self._check_crds, "checking Muster's CRDs", self.problems)
        if self.kueue is not None:
            try:
                # Before anything runs: a missing Kueue is fatal.
                await retrying(self.kueue.preflight, "checking Kueue's API", self.problems)
            except KueueNotInstalled as exc:
                raise StartupError(str(exc)) from None
        self.feeds.start()
        await self._wait_synced()
        # Every pool's provider, not only those already used: after a restart the kind
        # provider must adopt and heartbeat the nodes it created before.
        for pool in self.state.pool_registry.pools().values():
            try:
                self.providers.for_pool(pool)
            except ProviderConfigError as exc:  # the reconcile reports it on the request
                log.warning("pool %s: %s", pool.metadata.name, exc)
        for name, provider in self.providers.instances().items():
            await retrying(provider.start, f"starting provider {name}", self.problems)
        self.providers.running = True
        released = await retrying(self.collector.run_once, "start-up collection", self.problems)
        if released:
            log.info("start-up collection released %d group(s)", len(released))
        await sync_pool_finalizers(self.kube, self.state, self.providers, self.config.classes)
        self.events.start()
        self.planner.start()
        self.queue.start()
        if self.service.wakeups is not None:
            self.wakeups.start()
        self._started = True
        for key in list(self.state.objects.requests()):
            self.queue.add(key)
        self._tasks.append(asyncio.create_task(self._collect_loop(), name="collector"))
        self._tasks.append(asyncio.create_task(self._pool_loop(), name="pool-finalizers"))
        self._tasks.append(asyncio.create_task(self.pool_status.run(), name="pool-status"))
        await self._start_integrations()
        self.ready = True

    async def _start_integrations(self) -> None:
        if self.kueue is not None:
            await self.kueue.start()
        if self.podgroups is not None and not await retrying(
                self.podgroups.start, "starting native gangs", self.problems):
            self.podgroups = None  # the API is not served (logged)

    async def _wait_synced(self) -> None:
        while True:  # the watches retry their lists themselves; this only waits and says so
            try:
                await self.feeds.wait_synced(within=LOG_INTERVAL)
                return
            except TimeoutError:
                log.warning("caches not synced yet (%s); waiting",
                            ", ".join(self.feeds.unsynced()))

    def halt(self) -> None:
        """Stop acting at once, synchronously: called the moment leadership is lost, before
        any other coroutine runs, so no reconcile, collection or Workload update gets past
        its next await. :meth:`stop` then tears down the rest (watches, providers)."""
        self.ready = False
        self._started = False
        self.providers.running = False
        self.queue.halt()
        self.wakeups.halt()
        if self.kueue is not None:
            self.kueue.halt()
        if self.podgroups is not None:
            self.podgroups.halt()
        for task in self._tasks:
            task.cancel()

    def failed_tasks(self) -> list[str]:
        """Names of the long-running tasks that ended while the controller runs (by an
        exception or a cancellation nobody asked for): the liveness probe fails on any.

        A task that returned normally is not failed (a DRA watch ends when the cluster does
        not serve resource.k8s.io). The planner's task is private to controller.state.
        """
        if not self.ready:
            return []
        tasks = [*self._tasks, *self.queue.tasks, *self.feeds.tasks, *self.wakeups.tasks]
        if self.kueue is not None:
            tasks += self.kueue.tasks
        if self.podgroups is not None:
            tasks += self.podgroups.tasks
        return sorted(
            t.get_name() for t in tasks
            if t.done() and (t.cancelled() or t.exception() is not None)
        )

    def stalled_watches(self) -> list[str]:
        """The watches (of this controller's client) whose view has not moved for
        :attr:`stall_after` seconds (stuck), or for :attr:`failing_after` seconds while
        their requests fail (API server unreachable or erring)."""
        return sorted(self._stalls())

    def stall_reasons(self) -> list[str]:
        """Why each stalled watch counts as stalled, by the threshold it was judged by (a
        failing watch by ``min(failing_after, stall_after)``, a quiet one by
        ``stall_after``), with how long it has made no progress."""
        stalls = self._stalls()
        failing = sorted(n for n, (error, _) in stalls.items() if error is not None)
        quiet = sorted(n for n, (error, _) in stalls.items() if error is None)
        out = []
        if failing:
            limit = min(self.failing_after, self.stall_after)
            idle = max(stalls[n][1] for n in failing)
            errors = sorted({str(stalls[n][0]) for n in failing})
            out.append(f"watch(es) {', '.join(failing)} made no progress for over {limit:.0f}s "
                       f"(up to {idle:.0f}s) while their requests fail: {'; '.join(errors)}")
        if quiet:
            idle = max(stalls[n][1] for n in quiet)
            out.append(f"watch(es) {', '.join(quiet)} made no progress for over "
                       f"{self.stall_after:.0f}s (up to {idle:.0f}s)")
        return out

    def _stalls(self) -> dict[str, tuple[str | None, float]]:
        """Stalled watch -> (its last error while failing, seconds without progress)."""
        if not self.ready:
            return {}
        now = asyncio.get_running_loop().time()
        out = {}
        for name, health in self.kube.watches.items():
            idle = now - health.progress_at
            limit = (min(self.failing_after, self.stall_after) if health.error is not None
                     else self.stall_after)
            if idle > limit:
                out[name] = (health.error, idle)
        return out

    async def _check_crds(self) -> None:
        """Fail start-up with the fix when a CRD Muster serves or reads is not installed."""
        for res, crd in ((PROVISIONING_REQUESTS, "provisioningrequests.autoscaling.x-k8s.io"),
                         (CAPACITY_POOLS, "capacitypools.muster.dev")):
            try:
                await self.kube.list(res)
            except ApiError as exc:
                if exc.not_found:
                    raise StartupError(
                        f"the CRD {crd} is not installed in {self.kube.host}; "
                        "install Muster's CRDs first: kubectl apply -f crds/"
                    ) from None
                if transient(exc):
                    raise  # retried by start()
                raise StartupError(f"the API server {self.kube.host} refuses: {exc}") from None

    async def stop(self) -> None:
        """Stop everything, then wait for the API requests still unanswered: the caller
        closes the client next, and a request of a cancelled task is still running
        (shielded, :meth:`controller.kube.KubeClient.drain`)."""
        self.ready = False
        self._started = False
        self.providers.running = False
        if self.kueue is not None:
            await self.kueue.stop()
        if self.podgroups is not None:
            await self.podgroups.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("task %s failed while stopping", task.get_name())
        await self.wakeups.stop()
        await self.queue.stop()
        await self.planner.stop()
        await self.events.stop()  # after the queue: the last reconciles' events still go out
        await self.feeds.stop()
        for provider in self.providers.instances().values():
            await provider.stop()
        left = await self.kube.drain(within=DRAIN_SECONDS)
        if left:
            log.warning("%d API request(s) still unanswered while stopping", left)
        self._tasks = []

    def health(self) -> dict[str, Any]:
        return {
            "requests": len(self.state.objects.requests()),
            "bookings": len(self.state.ledger.bookings()),
            "nodes": len(self.state.objects.nodes()),
            "reconciling": self.queue.busy,
            "planner_passes": self.planner.passes,
        }

    async def _pool_loop(self) -> None:
        """Pool finalizers: added as soon as a pool appears (and, at the latest, by
        ``hold_pools`` before anything is acquired through it); removed once a deleted
        pool's last node is released (checked every collection interval, since node
        deletions do not change the pool)."""
        changed = self.state.pool_registry.pools_changed
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self.collect_interval)
            changed.clear()
            try:
                await sync_pool_finalizers(self.kube, self.state, self.providers,
                                           self.config.classes, wake=self.queue.add)
            except ApiError as exc:
                self.problems.warning("pool finalizers", "updating CapacityPool finalizers "
                                      "failed (%s); trying again", describe(exc))
            else:
                self.problems.resolved("pool finalizers")

    async def _collect_loop(self) -> None:
        while True:
            await self.clock.sleep(self.collect_interval)
            try:
                await self.collector.run_once()
            except Exception as exc:
                if not (transient(exc) or isinstance(exc, ApiError)):
                    log.exception("orphan collection failed; trying again later")
                    continue
                self.problems.warning("collection", "orphan collection failed (%s); trying "
                                      "again every %.0fs", describe(exc), self.collect_interval)
            else:
                self.problems.resolved("collection")
