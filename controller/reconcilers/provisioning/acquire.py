"""Acquisition (phase Acquiring): every group all or nothing, the launched nodes persisted on
the plan, each node registered as it appears, and a bounded wait for Ready; then confirm, or
release and retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

from controller.acquire.groups import AcquisitionFailed, acquire_all, release_groups
from controller.acquire.registration import (
    OutsideDomain,
    awaiting_cloud,
    missing_devices,
    register,
    registration,
    registration_budget,
)
from controller.common import crashpoints
from controller.common.clock import Clock
from controller.common.conditions import ConditionType, Reason, message
from controller.common.decision_log import log_decision
from controller.lifecycle import PLAN_ANNOTATION, Event
from controller.reconcilers import queued
from controller.reconcilers.pools import hold_pools
from controller.reconcilers.provisioning.base import Delay, _accepted, _group_text
from controller.reconcilers.provisioning.booking import Bookings
from controller.state.bookings import Booking
from controller.state.requests import RequestRecord

log = logging.getLogger(__name__)


class Acquisition(Bookings):
    """Acquire, register, wait for Ready."""

    async def acquire(
        self, req: RequestRecord, booking: Booking, *, announce: bool = False
    ) -> Delay:
        """All groups or none, then bounded wait for Ready, then Provisioned=True.

        ``announce``: also set Provisioned=False/Provisioning if the acquisition (provider
        calls, then the wait for Ready) is still running after
        ``acquisition.announce_after_seconds`` (the plan and keys are already persisted; the
        condition is for humans and takes the write only when it has something to tell).
        """
        self.state.ledger.reserve(req.key, booking)
        waiting = await queued.step(self, req, booking)
        if waiting is not False:
            return waiting
        keys = {g.key for g in booking.groups}
        self.in_flight |= keys
        announcing = _Later(self.clock, self.config.acquisition.announce_after_seconds,
                            lambda: self._announce(req, booking)) if announce else None
        pools = {g.pool for g in booking.groups}
        self.state.ledger.begin_acquiring(pools)
        # A resumed attempt acquires its keys anew: its own nodes are not released ones.
        self.state.ledger.forget_released(keys)
        try:
            try:
                await hold_pools(self.kube, pools)
                nodes = await acquire_all(
                    booking.groups,
                    owner=req.key,
                    owner_uid=req.uid,
                    pools=self.state.pool_registry.pools(),
                    provider_for=self.providers.for_pool,
                    ledger=self.state.ledger,
                )
                crashpoints.reached("acquired")
                booking = booking.with_nodes(
                    {k: [n.name for n in got] for k, got in nodes.items()},
                    {k: [n.provider_id for n in got if n.provider_id]
                     for k, got in nodes.items()},
                )
                log_decision("acquire", req.key, outcome="acquired", attempt=booking.attempt,
                       groups=[_group_text(g) for g in booking.groups],
                       nodes=sorted(booking.acquired_nodes))
                self.state.ledger.reserve(req.key, booking)
                req = await self.remember_launched(req, booking)
                pools_now = self.state.pool_registry.pools()
                timeout = registration_budget(
                    (pools_now[p] for p in pools if p in pools_now),
                    self.config.acquisition.node_ready_timeout_seconds)
                not_ready, outside = await self.wait_nodes(req, booking, within=timeout)
            finally:
                # Later status writes start from this one's conditions, never race it.
                if announcing is not None:
                    req = await announcing.result(req)
            if outside:
                # The cloud put the gang elsewhere than planned: its pods would be split
                # across domains. Release everything and plan again away from this domain.
                until = self.clock.now() + timedelta(
                    seconds=self.config.retry.max_backoff_seconds)
                for group in booking.groups:
                    self.state.mark_short(group.pool, group.domain, available=0, until=until)
                await release_groups(
                    booking.groups, pools=self.state.pool_registry.pools(),
                    provider_for=self.providers.for_pool,
                    owner=req.key, why="a node registered outside the planned domain",
                    ledger=self.state.ledger,
                )
                log_decision("acquire", req.key, outcome="outside-domain", attempt=booking.attempt,
                       nodes=[o.describe() for o in outside[:5]])
                return await self.retry_or_fail(
                    req, attempt=booking.attempt, reason=Reason.ACQUISITION_FAILED,
                    detail="; ".join(o.describe() for o in outside[:5])
                    + "; every node of the attempt was released",
                )
            if not_ready:
                await release_groups(
                    booking.groups, pools=self.state.pool_registry.pools(),
                    provider_for=self.providers.for_pool,
                    owner=req.key, why=f"{len(not_ready)} node(s) not Ready in time",
                    ledger=self.state.ledger,
                )
                return await self.retry_or_fail(
                    req, attempt=booking.attempt, reason=Reason.NODES_NOT_READY,
                    detail=f"{len(not_ready)} node(s) not Ready: {', '.join(not_ready[:5])}",
                    permanent=False, ready_within=timeout,
                )
        except AcquisitionFailed as exc:
            log_decision("acquire", req.key, outcome="failed", attempt=booking.attempt,
                   groups=[_group_text(g) for g in booking.groups], reason=exc.reason,
                   retryable=exc.retryable, error=str(exc),
                   short=[_group_text(g) + f" (stock {n})" for g, n in exc.short])
            until = self.clock.now() + timedelta(seconds=self.config.retry.max_backoff_seconds)
            for group, available in exc.short:
                self.state.mark_short(group.pool, group.domain, available=available, until=until)
            return await self.retry_or_fail(
                req, attempt=booking.attempt, reason=queued.stock_out(self, req, exc),
                detail=str(exc), permanent=not exc.retryable,
            )
        finally:
            self.in_flight -= keys
            self.state.ledger.end_acquiring(pools)
        return await self.confirm(req, booking)

    async def remember_launched(self, req: RequestRecord, booking: Booking) -> RequestRecord:
        """Persist what the provider launched (names and providerIDs) on the plan, once:
        a restarted controller, or a booking checked for vanished nodes, then knows the
        group's nodes by providerID, whatever names or labels they registered with."""
        if req.booking is not None and req.booking.groups == booking.groups:
            return req
        self.take(req, Event.LAUNCHED)
        return await self.persist(req, annotations={PLAN_ANNOTATION: booking.to_annotation()})

    async def wait_nodes(
        self, req: RequestRecord, booking: Booking, *, within: float
    ) -> tuple[list[str], list[OutsideDomain]]:
        """Register the node of every providerID the booking's groups launched as it
        appears (:mod:`controller.acquire.registration`) and wait until each is registered,
        Ready and settled, or ``within`` seconds pass (the injected clock). Return the nodes
        still not so (their names, or the provider's name hints) and the nodes that
        registered outside their planned domain (the wait ends at the first)."""
        hints = {p: n for g in booking.groups for p, n in zip(g.provider_ids, g.nodes,
                                                              strict=False)}
        # Listen before each look: _register awaits its writes, and a node that changes
        # while it looks at another must still wake the wait.
        every = [p for g in booking.groups for p in (g.provider_ids or g.nodes)]
        change = self.state.objects.changed(every)
        pending, outside = await self._register(req, booking)
        timer = asyncio.ensure_future(self.clock.sleep(within))
        try:
            while pending and not outside and not timer.done():
                await asyncio.wait({change, timer}, return_when=asyncio.FIRST_COMPLETED)
                change.cancel()
                change = self.state.objects.changed(pending)
                pending, outside = await self._register(req, booking)
        finally:
            change.cancel()
            timer.cancel()
        out: list[str] = []
        pools = {p: self.state.pool_registry.pools().get(g.pool) for g in booking.groups
                 for p in g.provider_ids}
        for pid in pending:
            node = self.state.objects.node_by_provider_id(pid)
            pool = pools.get(pid)
            missing = missing_devices(node, pool) if node is not None and pool else []
            if node is not None and missing:
                # The device plugin never advertised what the pool's nodes offer.
                out.append(f"{node.metadata.name} (no {', '.join(missing)} in allocatable)")
            elif node is not None:
                out.append(node.metadata.name)
            elif "://" in pid:
                # No Node with the providerID: the machine's kubelet never registered (a
                # bootstrap that does not join the cluster, a wrong cluster endpoint).
                out.append(f"{hints.get(pid, pid)} ({pid}: never registered)")
            else:
                out.append(pid)
        return out, outside

    async def _register(
        self, req: RequestRecord, booking: Booking
    ) -> tuple[list[str], list[OutsideDomain]]:
        """Register the booking's nodes that appeared; return the providerIDs (or, for a
        group whose provider gave none, the names) without a registered, settled node and
        the nodes found outside their domain."""
        pending: list[str] = []
        outside: list[OutsideDomain] = []
        pools = self.state.pool_registry.pools()
        for group in booking.groups:
            if not group.provider_ids:
                pending.extend(n for n in group.nodes if not self.state.objects.node_ready(n))
                continue
            pool = pools.get(group.pool)
            for pid in group.provider_ids:
                node = self.state.objects.node_by_provider_id(pid)
                if node is None or pool is None or awaiting_cloud(node):
                    pending.append(pid)
                    continue
                patch = registration(node, pool, group, owner=req.key, owner_uid=req.uid)
                if isinstance(patch, OutsideDomain):
                    outside.append(patch)
                    continue
                if patch is not None:
                    written = await register(self.kube, node.metadata.name, patch)
                    # Not a decision line: the acquisition's own line names the nodes.
                    log.debug("%s: registering node %s (%s) as %s of pool %s: %s", req.key,
                              node.metadata.name, pid, group.key, group.pool,
                              "written" if written else "changed meanwhile, retried")
                    if written is not None:
                        # The watch may bring the write after the next look: a node left
                        # pending until its next change would wait for nothing.
                        self.state.upsert_node(written)
                        node = self.state.objects.node_by_provider_id(pid)
                    if (node is None or written is None or not node.settled
                            or missing_devices(node, pool)):
                        pending.append(pid)
                elif not node.settled or missing_devices(node, pool):
                    pending.append(pid)
        return pending, outside

    async def _announce(self, req: RequestRecord, booking: Booking) -> RequestRecord:
        new_nodes = sum(g.count for g in booking.groups)
        text = message(Reason.PROVISIONING, new_nodes=new_nodes, attempt=booking.attempt)
        self.take(req, Event.ANNOUNCED)
        return await self.write_status(
            req, [_accepted(), (ConditionType.PROVISIONED, False, Reason.PROVISIONING, text)]
        )


class _Later:
    """A status write that happens only if it is still wanted after ``delay`` seconds."""

    def __init__(
        self, clock: Clock, delay: float, write: Callable[[], Awaitable[RequestRecord]]
    ) -> None:
        self._started = False

        async def run() -> RequestRecord:
            await clock.sleep(delay)
            self._started = True
            return await write()

        self._task = asyncio.create_task(run())

    async def result(self, current: RequestRecord) -> RequestRecord:
        """The request after the write if it began (waiting for it), else ``current``."""
        if self._started:
            return await self._task
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return current
