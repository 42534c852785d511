"""The ProvisioningRequest service: one level-triggered reconcile per request key.

:meth:`ProvisioningService.reconcile` reads the request from the cache and takes the next
step for its phase (``muster.dev/phase``):

* new: validate, plan and book (through the single :class:`Planner`), persist the plan and
  the idempotency keys, then either Provisioned=True (fits existing nodes) or acquire;
* Acquiring: acquire every group all or nothing, wait bounded for Ready, Provisioned=True;
  resumed with the same keys after a restart, so nothing is acquired twice;
* Booked: end the booking when the pods are all scheduled, the booking time passed, or
  booked nodes vanished; release what the gang never used;
* deleting: release unused nodes, drop the finalizer.

Failures retry with exponential backoff up to ``retry.max_attempts``, then Failed. Muster's
own state lives in annotations; conditions are written with ``/status`` merge patches. Both
cannot go in one write, so each change is ordered for repair: a plan is persisted (phase
Acquiring) before the status write that makes it a booking, and an outcome (Failed, booking
ended) is written to the status first, where it decides the phase, with the annotations
following; whatever a crash or a failed write cuts short, the next reconcile redoes. All
time comes from the injected clock. Muster's own watch (:mod:`controller.state.feeds`) feeds
the cache and enqueues keys; nothing else reaches the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from controller import crashpoints
from controller.acquire.atomic import AcquisitionFailed, acquire_all, release_groups
from controller.acquire.keys import groups_for
from controller.acquire.providers import ProviderSet
from controller.acquire.registration import (
    OutsideDomain,
    awaiting_cloud,
    missing_devices,
    observed_domain,
    placeholder,
    register,
    registration,
)
from controller.api.node import Node
from controller.api.parameters import (
    NO_RETRY,
    RELAX_TOPOLOGY_AFTER,
    VALID_UNTIL_SECONDS,
    Parameters,
    read_parameters,
)
from controller.api.pod import PodTemplate
from controller.api.provisioningrequest import ProvisioningRequest
from controller.clock import Clock
from controller.conditions import (
    ConditionType,
    Reason,
    Transition,
    message,
    rfc3339,
    set_condition,
    transitions,
)
from controller.config import MusterConfig
from controller.constraints import needs_running_pods
from controller.decisions import decide
from controller.fit.explain import shortfall
from controller.fit.shapes import selector_matches, untolerated
from controller.fit.taints import CONDITION_TAINTS, UNSCHEDULABLE
from controller.fit.types import (
    GangRequest,
    Mode,
    NoFit,
    Plan,
    PodSetPlacement,
    PodShape,
    ReasonCode,
    Taint,
)
from controller.kube import ApiError, Body, KubeClient
from controller.kube.events import EventRecorder
from controller.kube.resources import PROVISIONING_REQUESTS
from controller.reconcilers.pools import hold_pools
from controller.relaxation import (
    RELAXED_DETAIL,
    alternatives,
    hold_until,
    pools_default,
    relax_after,
    relax_at,
    relaxable,
    relaxed_placements,
)
from controller.relaxation import describe as describe_relaxed
from controller.relaxation import detail as relaxed_detail
from controller.snapshot import InvalidTemplate, SnapshotError, gang_of, parse_object
from controller.state.bookings import (
    ATTEMPT_ANNOTATION,
    FINALIZER,
    PHASE_ANNOTATION,
    PLAN_ANNOTATION,
    RETRY_AT_ANNOTATION,
    TEMPLATES_ANNOTATION,
    UNREADY_ANNOTATION,
    Booking,
    Group,
    Phase,
    stale_templates,
    template_digest,
)
from controller.state.cache import ClusterState, TemplateError, object_key
from controller.state.planner import Planner, Refusal
from controller.state.requests import RequestRecord
from controller.state.tenancy import exceeded, foreign_request_owner
from controller.state.wakeups import Wakeups

log = logging.getLogger(__name__)

Delay = float | None

TOPOLOGY_LEVEL_DETAIL = "muster.dev/topology-level"
TOPOLOGY_DOMAIN_DETAIL = "muster.dev/topology-domain"
NEW_NODES_DETAIL = "muster.dev/new-nodes"


ARRIVAL_POLL_SECONDS = 0.5

WAITING_REASONS = frozenset({
    Reason.CAPACITY_IS_NOT_FOUND, Reason.NAMESPACE_LIMIT_REACHED, Reason.POOL_UNUSABLE,
})
"""A request whose last attempt ended so waits for something Muster sees change."""


@dataclass(frozen=True, slots=True)
class Invalid(Exception):
    reason: Reason
    detail: str
    missing: tuple[str, ...] = ()
    """What the request refers to and the cache does not hold (``PodTemplate ns/t``,
    ``ResourceClaimTemplate ns/c``, ``DeviceClass gpu``): each comes through its own watch
    and may only be late, so the request waits for it (``retry.arrival_wait_seconds``)."""


class ProvisioningService:
    def __init__(
        self,
        *,
        kube: KubeClient,
        state: ClusterState,
        planner: Planner,
        providers: ProviderSet,
        config: MusterConfig,
        clock: Clock,
        on_transition: Callable[[Body, Sequence[Transition]], None] | None = None,
        recorder: EventRecorder | None = None,
    ) -> None:
        self.kube = kube
        self.state = state
        self.planner = planner
        self.providers = providers
        self.config = config
        self.clock = clock
        self.in_flight: set[str] = set()
        """Acquisition keys with provider calls running in this process."""
        self.on_transition = on_transition
        """Told of every condition a status write changed (Events, metrics); must not block."""
        self.recorder = recorder
        """Posts the ParametersIgnored Warning when a request is first accepted."""
        self._shapes: dict[str, tuple[tuple[Any, ...], Mapping[str, PodShape]]] = {}
        """Booked requests' pod shapes and what they were built from (``_booked_shapes``)."""
        self.wakeups: Wakeups | None = None
        """Wakes waiting requests when capacity may have freed (see :meth:`waiting`)."""

    # ------------------------------------------------------------------ entry point

    async def reconcile(self, key: str) -> Delay:
        """Take the next step for ``key``; a write that lost a race (409) or hit a deleted
        object (404) refreshes the cached object and tries again at once."""
        try:
            return await self._reconcile(key)
        except ApiError as exc:
            # A plan reserved in memory but not persisted must not hold capacity meanwhile;
            # a persisted one is still booked through its annotation.
            self.state.unreserve(key)
            if not (exc.conflict or exc.not_found):
                raise
            namespace, _, name = key.partition("/")
            fresh = await self.kube.get_or_none(
                PROVISIONING_REQUESTS, name, namespace=namespace
            )
            if fresh is None:
                self.state.delete_request(key)
                return None
            self.state.upsert_request(fresh)
            return 0.05

    async def _reconcile(self, key: str) -> Delay:
        woken = self.wakeups is not None and self.wakeups.claim(key)
        req = self.state.request(key)
        if req is None:
            self.state.unreserve(key)
            return None
        mode = self.config.classes.mode_for(req.class_name, req.parameters)
        if mode is None:
            return None
        if req.deleting:
            return await self.finalize(req)
        phase = req.phase
        if phase is Phase.FAILED:
            return await self.repair_failed(req)
        if phase is Phase.ENDED:
            return await self.repair_ended(req)
        if phase is Phase.BOOKED:
            return await self.check_booking(req)
        if phase is Phase.ACQUIRING:
            booking = req.booking
            if booking is None:
                return await self.retry_or_fail(
                    req, attempt=req.attempt, reason=Reason.ACQUISITION_FAILED,
                    detail=f"the {PLAN_ANNOTATION} annotation is unreadable",
                )
            return await self.resume(req, booking)
        return await self.provision(req, mode, woken=woken)

    def waiting(self) -> list[str]:
        """The requests waiting for capacity Muster can see free, in the order to plan them
        (:meth:`plan_order`): not yet
        planned, their last attempt found no fit (``CapacityIsNotFound``), met a full
        namespace or a pool the provider refuses. Not those whose acquisition failed
        (a cloud's stock, which Muster cannot watch) or whose nodes never got Ready: their
        backoff is the only signal."""
        now = self.clock.now()
        waiting = [
            req for req in self.state.requests().values()
            if req.retry_at is not None and not req.deleting
            and req.annotated_phase is Phase.NEW and _waiting_reason(req) in WAITING_REASONS
        ]
        waiting.sort(key=lambda req: self.plan_order(req, now))
        return [req.key for req in waiting]

    def plan_order(self, req: RequestRecord, now: datetime) -> tuple[Any, ...]:
        """Where ``req`` goes in a planner pass (``retry.replan_order``): by arrival, or by
        when its backoff timer fires (a request planned now, new or due, before those still
        waiting: the order the timers alone would plan them in), then by arrival."""
        arrival = self.state.arrival(req.key)
        if self.config.retry.replan_order == "arrival":
            return arrival
        due = req.retry_at if req.retry_at is not None and req.retry_at > now else now
        return (due, *arrival)

    async def resume(self, req: RequestRecord, booking: Booking) -> Delay:
        """An acquisition this call did not just persist (after a restart, or a retry after
        an error): read the request from the API server first. A confirming status write
        whose answer was lost (the API server went away mid-request) did land; the cache,
        fed by a watch that was down too, still says Acquiring, and resuming from it would
        roll back (nodes not Ready in time, a failed call) nodes of a live booking."""
        fresh = await self.kube.get_or_none(
            PROVISIONING_REQUESTS, req.name, namespace=req.namespace
        )
        if fresh is None:
            return None
        self.state.upsert_request(fresh)
        current = self.state.request(req.key)
        if current is None:  # seen deleted meanwhile
            return None
        if current.phase is not Phase.ACQUIRING or current.booking is None:
            return 0.0  # the next reconcile takes it from its real phase
        return await self.acquire(current, current.booking)

    # ------------------------------------------------------------------ new requests

    async def provision(self, req: RequestRecord, mode: Mode, *, woken: bool = False) -> Delay:
        """``woken``: planned ahead of its backoff timer because capacity may have freed
        (:class:`Wakeups`); if it still does not fit, nothing is written and the timer
        stands."""
        now = self.clock.now()
        retry_at = req.retry_at
        waiting = retry_at is not None and retry_at > now
        if retry_at is not None and waiting and not woken:
            return (retry_at - now).total_seconds()
        try:
            gang = self.gang(req, mode)
        except Invalid as exc:
            if exc.missing:
                wait = self.arrival_grace_left(req)
                if wait > 0:
                    # Its arrival (the cache's watch event) reconciles the request at once;
                    # the timer only ends the wait.
                    self.state.wait_for(req.key, exc.missing)
                    return wait
            self.state.wait_for(req.key, ())
            return await self.fail(req, exc.reason, message(
                exc.reason, detail=exc.detail,
                missing=", ".join(exc.missing) or "the PodTemplate(s) in the request's namespace",
            ))
        self.state.wait_for(req.key, ())
        digests = json.dumps(self.template_digests(req.namespace, req.template_names),
                             sort_keys=True, separators=(",", ":"))
        attempt = req.attempt + 1
        relaxable_sets, relax_time = self.relaxation(req, gang)
        result = await self.planner.plan(
            req.key, gang, mode, lambda plan: self.book(req, plan, attempt),
            order=self.plan_order(req, now),
            fallbacks=alternatives(gang, relaxable_sets, self.state.levels)
            if relax_time is not None and now >= relax_time else (),
            explain=not waiting,
            hold_until=hold_until(relax_time, now, self.config.topology.reserve_seconds),
        )
        if waiting and retry_at is not None and not isinstance(result, Plan):
            # Still no fit: the backoff timer keeps the request's attempts and condition
            # (a churn of wake-ups must not turn into a churn of writes).
            return max(0.0, (retry_at - self.clock.now()).total_seconds())
        if isinstance(result, Refusal):
            if result.wait:
                return await self.retry_or_fail(
                    req, attempt=attempt, reason=result.reason, detail=result.text
                )
            return await self.fail(req, result.reason, result.text)
        if isinstance(result, NoFit):
            return await self.no_fit(req, gang, mode, result, attempt, relax_time=relax_time)
        booking = self.state.bookings().get(req.key)
        if booking is None:  # the request was deleted while it was being planned
            return None
        decide("plan", req.key, outcome="fits", attempt=attempt, where=_where(result),
               existing_nodes=len(set(booking.existing_nodes)),
               new_nodes=sum(g.count for g in booking.groups),
               groups=[_group_text(g) for g in booking.groups],
               cost_per_hour=round(result.cost_per_hour, 4))
        # Persisted as Acquiring even with no new nodes: should the status write that
        # confirms it fail or the process die first, the resumed "acquisition" of nothing
        # confirms it. (Persisting it as Booked left a booking that expired without
        # Provisioned=True ever written.) Only acquired nodes need the release finalizer.
        req = await self.persist(
            req,
            annotations={
                PLAN_ANNOTATION: booking.to_annotation(),
                ATTEMPT_ANNOTATION: str(attempt),
                PHASE_ANNOTATION: Phase.ACQUIRING,
                RETRY_AT_ANNOTATION: None,
                TEMPLATES_ANNOTATION: digests,
            },
            finalizer=True if booking.groups else None,
        )
        crashpoints.reached("plan-persisted")
        if not booking.groups:
            return await self.confirm(req, booking)
        return await self.acquire(req, booking, announce=True)

    def relaxation(self, req: RequestRecord, gang: GangRequest) -> tuple[
            dict[str, str], datetime | None]:
        """The pod sets of ``gang`` Muster may relax (name -> required level) and when it
        may (None: never); see :mod:`controller.relaxation`."""
        sets = relaxable(gang, self._template_annotations(req), self.state.levels)
        default = pools_default(gang, sets, self.state.pools().values(),
                                self.config.topology.relax_after_seconds)
        seconds = relax_after(self.parameters(req).values.relax_topology_after_seconds,
                              req.annotations, default)
        when = relax_at(req.created_at, seconds)
        if when is None or not sets:
            return {}, None
        return sets, when

    def arrival_grace_left(self, req: RequestRecord) -> float:
        """Seconds this request still waits for objects created with it (a PodTemplate, a
        CapacityPool, nodes) before a verdict that they are missing is final (0: now)."""
        created = req.created_at
        if created is None:
            return 0.0
        age = max(0.0, (self.clock.now() - created).total_seconds())
        # Requests, templates, pools and nodes come through separate watches, and clients
        # create them a moment apart in either order: one missing from the cache may be late.
        return max(0.0, self.config.retry.arrival_wait_seconds - age)

    def gang(self, req: RequestRecord, mode: Mode) -> GangRequest:
        """The request as the fit engine sees it; :class:`Invalid` names what is wrong."""
        return build_gang(req, self.state, self.config)

    def parameters(self, req: RequestRecord) -> Parameters:
        """The request's parameters as Muster reads them (see
        :mod:`controller.api.parameters`)."""
        mode = self.config.classes.mode_for(req.class_name, req.parameters) or Mode.PROVISION
        return read_parameters(req.parameters, mode, req.class_name)

    def valid_until(self, req: RequestRecord, params: Parameters) -> datetime | None:
        """Creation + ValidUntilSeconds: no attempt starts after it."""
        created = req.created_at
        seconds = params.values.valid_until_seconds
        if seconds is None or created is None:
            return None
        try:
            return created + timedelta(seconds=seconds)
        except OverflowError:
            # Past the last representable date (up to 255 digits are valid): no deadline.
            return None

    def book(self, req: RequestRecord, plan: Plan, attempt: int) -> Booking | Refusal:
        """The booking to reserve for ``plan``, or why a budget or the namespace's limits
        refuse it. Runs in the planner's synchronous step (see :meth:`Planner.plan`), so the
        namespace's usage read here includes every booking reserved before it."""
        budgets = self.config.budgets
        new_nodes = sum(n.count for n in plan.new_nodes)
        if budgets.max_new_nodes_per_request is not None and (
            new_nodes > budgets.max_new_nodes_per_request
        ):
            return Refusal(Reason.OVER_BUDGET, message(
                Reason.OVER_BUDGET,
                detail=f"{new_nodes} new nodes > budgets.max_new_nodes_per_request "
                f"({budgets.max_new_nodes_per_request})",
            ))
        limit = budgets.max_cost_per_hour_per_request
        if limit is not None and plan.cost_per_hour > limit:
            return Refusal(Reason.OVER_BUDGET, message(
                Reason.OVER_BUDGET,
                detail=f"new nodes cost {plan.cost_per_hour:.2f}/h > "
                f"budgets.max_cost_per_hour_per_request ({limit:.2f})",
            ))
        limits = budgets.for_namespace(req.namespace)
        if limits.limited and new_nodes:
            want = self.state.plan_usage((n.pool, n.count) for n in plan.new_nodes)
            alone = exceeded(limits, want)
            if alone:
                return Refusal(Reason.OVER_BUDGET, message(
                    Reason.OVER_BUDGET,
                    detail=f"its new nodes alone exceed namespace {req.namespace}'s limits "
                    f"({'; '.join(alone)})",
                ))
            held = self.state.namespace_usage(req.namespace)
            beside = exceeded(limits, held + want)
            if beside:
                return Refusal(
                    Reason.NAMESPACE_LIMIT_REACHED,
                    f"namespace {req.namespace} holds {held.describe()}; this plan adds "
                    f"{want.describe()}, which would exceed its limits ({'; '.join(beside)})",
                )
        return Booking(plan=plan, attempt=attempt,
                       groups=groups_for(plan, owner_uid=req.uid, attempt=attempt))

    async def no_fit(self, req: RequestRecord, gang: GangRequest, mode: Mode, result: NoFit,
                     attempt: int, *, relax_time: datetime | None = None) -> Delay:
        # The shortfall first (where it came closest, by how much, whether waiting helps),
        # then the engine's reasons in full.
        reasons = "; ".join(r.message for r in result.reasons) or "no capacity"
        detail = f"{shortfall(result)} In detail: {reasons}"
        refused = self.planner.refused_pools_serving(gang, mode, self.clock.now())
        decide("plan", req.key, outcome="no-fit", attempt=attempt, permanent=result.permanent,
               codes=sorted({r.code.value for r in result.reasons}),
               shortfall=shortfall(result), **({"unusable_pools": sorted(refused)}
                                               if refused else {}))
        if refused:
            # A pool the provider refuses would hold the gang: the fix is the pool's, and
            # the request keeps its place until then (retry budget and ValidUntilSeconds).
            pools = "; ".join(f"CapacityPool {name} ({'; '.join(problems)})"
                              for name, problems in refused.items())
            return await self.retry_or_fail(
                req, attempt=attempt, reason=Reason.POOL_UNUSABLE,
                detail=f"{pools}. Without {'it' if len(refused) == 1 else 'them'}: {detail}",
            )
        if relax_time is not None and relax_time > self.clock.now():
            # Waiting helps once the topology may be relaxed, even when the strict request
            # can never fit (no single domain is big enough).
            return await self.retry_or_fail(
                req, attempt=attempt, reason=Reason.CAPACITY_IS_NOT_FOUND,
                detail=f"{detail} Muster relaxes its topology at {rfc3339(relax_time)} "
                f"({RELAX_TOPOLOGY_AFTER})", relax_time=relax_time,
            )
        if result.permanent:
            codes = {r.code for r in result.reasons}
            reason = (
                Reason.INVALID_PARAMETERS if ReasonCode.INVALID in codes
                else Reason.UNSUPPORTED_CONSTRAINT if ReasonCode.UNSUPPORTED in codes
                else Reason.NEVER_FITS
            )
            wait = self.arrival_grace_left(req) if reason is Reason.NEVER_FITS else 0.0
            if wait > 0:
                # A pool or nodes created with the request may not be in the cache yet: a new
                # or changed pool, or a new node, plans it again at once; the poll covers
                # what no arrival announces (a node's labels or taints changing).
                self.state.wait_for(req.key, ("CapacityPool", "Node"))
                return min(wait, ARRIVAL_POLL_SECONDS)
            return await self.fail(req, reason, message(reason, detail=detail))
        return await self.retry_or_fail(
            req, attempt=attempt, reason=Reason.CAPACITY_IS_NOT_FOUND, detail=detail
        )

    # ------------------------------------------------------------------ acquisition

    async def acquire(
        self, req: RequestRecord, booking: Booking, *, announce: bool = False
    ) -> Delay:
        """All groups or none, then bounded wait for Ready, then Provisioned=True.

        ``announce``: also set Provisioned=False/Provisioning if the acquisition (provider
        calls, then the wait for Ready) is still running after
        ``acquisition.announce_after_seconds`` (the plan and keys are already persisted; the
        condition is for humans and takes the write only when it has something to tell).
        """
        self.state.reserve(req.key, booking)
        keys = {g.key for g in booking.groups}
        self.in_flight |= keys
        announcing = _Later(self.clock, self.config.acquisition.announce_after_seconds,
                            lambda: self._announce(req, booking)) if announce else None
        pools = {g.pool for g in booking.groups}
        self.state.begin_acquiring(pools)
        # A resumed attempt acquires its keys anew: its own nodes are not released ones.
        self.state.released -= keys
        try:
            try:
                await hold_pools(self.kube, pools)
                nodes = await acquire_all(
                    booking.groups,
                    owner=req.key,
                    owner_uid=req.uid,
                    pools=self.state.pools(),
                    provider_for=self.providers.for_pool,
                    releasing=self.state.releasing, released=self.state.released,
                )
                crashpoints.reached("acquired")
                booking = booking.with_nodes(
                    {k: [n.name for n in got] for k, got in nodes.items()},
                    {k: [n.provider_id for n in got if n.provider_id]
                     for k, got in nodes.items()},
                )
                decide("acquire", req.key, outcome="acquired", attempt=booking.attempt,
                       groups=[_group_text(g) for g in booking.groups],
                       nodes=sorted(booking.acquired_nodes))
                self.state.reserve(req.key, booking)
                req = await self.remember_launched(req, booking)
                timeout = self.config.acquisition.node_ready_timeout_seconds
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
                    booking.groups, pools=self.state.pools(), provider_for=self.providers.for_pool,
                    owner=req.key, why="a node registered outside the planned domain",
                    releasing=self.state.releasing, released=self.state.released,
                )
                decide("acquire", req.key, outcome="outside-domain", attempt=booking.attempt,
                       nodes=[o.describe() for o in outside[:5]])
                return await self.retry_or_fail(
                    req, attempt=booking.attempt, reason=Reason.ACQUISITION_FAILED,
                    detail="; ".join(o.describe() for o in outside[:5])
                    + "; every node of the attempt was released",
                )
            if not_ready:
                await release_groups(
                    booking.groups, pools=self.state.pools(), provider_for=self.providers.for_pool,
                    owner=req.key, why=f"{len(not_ready)} node(s) not Ready in time",
                    releasing=self.state.releasing, released=self.state.released,
                )
                return await self.retry_or_fail(
                    req, attempt=booking.attempt, reason=Reason.NODES_NOT_READY,
                    detail=f"{len(not_ready)} node(s) not Ready: {', '.join(not_ready[:5])}",
                    permanent=False,
                )
        except AcquisitionFailed as exc:
            decide("acquire", req.key, outcome="failed", attempt=booking.attempt,
                   groups=[_group_text(g) for g in booking.groups], reason=exc.reason,
                   retryable=exc.retryable, error=str(exc),
                   short=[_group_text(g) + f" (stock {n})" for g, n in exc.short])
            until = self.clock.now() + timedelta(seconds=self.config.retry.max_backoff_seconds)
            for group, available in exc.short:
                self.state.mark_short(group.pool, group.domain, available=available, until=until)
            return await self.retry_or_fail(
                req, attempt=booking.attempt, reason=Reason.ACQUISITION_FAILED,
                detail=str(exc), permanent=not exc.retryable,
            )
        finally:
            self.in_flight -= keys
            self.state.end_acquiring(pools)
        return await self.confirm(req, booking)

    async def remember_launched(self, req: RequestRecord, booking: Booking) -> RequestRecord:
        """Persist what the provider launched (names and providerIDs) on the plan, once:
        a restarted controller, or a booking checked for vanished nodes, then knows the
        group's nodes by providerID, whatever names or labels they registered with."""
        if req.booking is not None and req.booking.groups == booking.groups:
            return req
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
        change = self.state.changed(every)
        pending, outside = await self._register(req, booking)
        timer = asyncio.ensure_future(self.clock.sleep(within))
        try:
            while pending and not outside and not timer.done():
                await asyncio.wait({change, timer}, return_when=asyncio.FIRST_COMPLETED)
                change.cancel()
                change = self.state.changed(pending)
                pending, outside = await self._register(req, booking)
        finally:
            change.cancel()
            timer.cancel()
        out: list[str] = []
        pools = {p: self.state.pools().get(g.pool) for g in booking.groups
                 for p in g.provider_ids}
        for pid in pending:
            node = self.state.node_by_provider_id(pid)
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
        pools = self.state.pools()
        for group in booking.groups:
            if not group.provider_ids:
                pending.extend(n for n in group.nodes if not self.state.node_ready(n))
                continue
            pool = pools.get(group.pool)
            for pid in group.provider_ids:
                node = self.state.node_by_provider_id(pid)
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
                        node = self.state.node_by_provider_id(pid)
                    if (node is None or written is None or not node.settled
                            or missing_devices(node, pool)):
                        pending.append(pid)
                elif not node.settled or missing_devices(node, pool):
                    pending.append(pid)
        return pending, outside

    async def _announce(self, req: RequestRecord, booking: Booking) -> RequestRecord:
        new_nodes = sum(g.count for g in booking.groups)
        text = message(Reason.PROVISIONING, new_nodes=new_nodes, attempt=booking.attempt)
        return await self.write_status(
            req, [_accepted(), (ConditionType.PROVISIONED, False, Reason.PROVISIONING, text)]
        )

    def template_digests(self, namespace: str, names: Sequence[str]) -> dict[str, str | None]:
        """PodTemplate name -> digest of its content now (None: missing; a template the
        cache could not parse digests its error)."""
        out: dict[str, str | None] = {}
        for name in names:
            found = self.state.template(namespace, name)
            if found is None:
                out[name] = None
            elif isinstance(found, TemplateError):
                out[name] = template_digest({"invalid": found.detail})
            else:
                out[name] = template_digest(found.template.model_dump(mode="json",
                                                                      by_alias=True))
        return out

    async def confirm(self, req: RequestRecord, booking: Booking) -> Delay:
        """Set Provisioned=True with the placement: the one write that turns a persisted
        plan (phase Acquiring) into a booking."""
        reason = Reason.CAPACITY_IS_PROVISIONED if booking.groups else Reason.CAPACITY_IS_FOUND
        try:
            details = class_details(booking.plan, self.observed_domains(booking))
            where = _where(booking.plan)
            relaxed, sets = self.relaxed(req, booking.plan)
            if relaxed:
                details[RELAXED_DETAIL] = relaxed_detail(relaxed)
                created = req.created_at
                waited = ((self.clock.now() - created).total_seconds()
                          if created is not None else None)
                where = f"{where}. {describe_relaxed(relaxed, sets, waited).rstrip('.')}"
            text = (
                message(reason, where=where)
                if reason is Reason.CAPACITY_IS_FOUND
                else message(reason, where=where, new_nodes=len(booking.acquired_nodes))
            )
            crashpoints.reached("before-confirm")
            req = await self.write_status(
                req, [_accepted(), (ConditionType.PROVISIONED, True, reason, text)],
                details=details,
            )
        finally:
            self.state.unreserve(req.key)
        await self.mark_booked(req)
        return self.config.booking.duration_seconds

    async def mark_booked(self, req: RequestRecord) -> RequestRecord:
        """Say ``Booked`` in the phase annotation users read, once Provisioned=True has
        landed (status and metadata are two writes: after a crash between them the request
        still reads as Booked, and the next reconcile writes the annotation)."""
        if req.annotated_phase is Phase.BOOKED:
            return req
        return await self.persist(req, annotations={PHASE_ANNOTATION: Phase.BOOKED})


    def relaxed(self, req: RequestRecord, plan: Plan) -> tuple[dict[str, str], dict[str, str]]:
        """The pod sets ``plan`` does not keep in the one domain their
        ``muster.dev/required-topology`` asks for (pod set -> where they went), and the
        required levels; empty when the plan is strict. Read from the plan, so it holds after
        a restart too."""
        mode = self.config.classes.mode_for(req.class_name, req.parameters) or Mode.PROVISION
        try:
            gang = self.gang(req, mode)
        except Invalid:
            return {}, {}
        sets, when = self.relaxation(req, gang)
        if when is None:
            return {}, {}
        return relaxed_placements(plan, sets), sets

    def _template_annotations(self, req: RequestRecord) -> list[Mapping[str, str]]:
        """The annotations of the PodTemplate of each of ``req``'s pod sets, in order."""
        notes: list[Mapping[str, str]] = []
        for ps in (req.body.get("spec") or {}).get("podSets") or []:
            ref = (ps.get("podTemplateRef") or {}).get("name") if isinstance(ps, dict) else None
            found = self.state.template(req.namespace, str(ref))
            notes.append(found.template.metadata.annotations
                         if found is not None and not isinstance(found, TemplateError) else {})
        return notes

    def observed_domains(self, booking: Booking) -> dict[tuple[str, str], str]:
        """(label, placeholder value) -> the value the nodes of the booking's groups
        registered with (pools without declared domains)."""
        out: dict[tuple[str, str], str] = {}
        for group in booking.groups:
            nodes = [n for name in self.state.group_node_names(group)
                     if (n := self.state.node(name)) is not None]
            if nodes:
                out.update(observed_domain(group, nodes))
        return out

    # ------------------------------------------------------------------ booked requests

    async def check_booking(self, req: RequestRecord) -> Delay:
        booking = req.booking
        if booking is None:
            return None
        if not req.condition_true(ConditionType.PROVISIONED):
            # Persisted as Booked by an earlier Muster whose status write never landed.
            return await self.confirm(req, booking)
        req = await self.mark_booked(req)
        ending = self._ending(req, booking)
        if ending is not None:
            return await self.end_booking(req, booking, *ending)
        booked_at = req.booked_at or self.clock.now()
        duration = self.config.booking.duration_seconds
        return (booked_at + timedelta(seconds=duration) - self.clock.now()).total_seconds()

    def _ending(
        self, req: RequestRecord, booking: Booking, *, expire: bool = False
    ) -> tuple[ConditionType, Reason, str] | None:
        """Why the booking ends now (consumed, revoked, expired), or None while it holds;
        ``expire``: call it expired when nothing else applies."""
        scheduled = sum(self.state.scheduled_consumers(req.key).values())
        total = req.total_pods
        if scheduled >= total:
            text = message(Reason.BOOKING_CONSUMED, total=total)
            elsewhere = self.consumed_elsewhere(req, booking)
            if elsewhere:
                text += (
                    f" {sum(elsewhere.values())} of them run outside the booked nodes (on "
                    f"{', '.join(sorted(elsewhere)[:5])}): the scheduler or Kueue TAS placed "
                    "them elsewhere, and booked new nodes they leave unused are released now. "
                    "With Kueue TAS, copy the booked domain into the pods with the "
                    "ProvisioningRequestConfig's podSetUpdates.nodeSelector."
                )
            return (ConditionType.BOOKING_EXPIRED, Reason.BOOKING_CONSUMED, text)
        stale = self.stale_templates(req)
        if stale is not None:
            reason, templates = stale
            return (ConditionType.CAPACITY_REVOKED, reason,
                    message(reason, detail=", ".join(f"{req.namespace}/{n}" for n in templates)))
        unusable = self.unusable_booked_nodes(req, booking)
        if unusable:
            return (ConditionType.CAPACITY_REVOKED, Reason.NODES_UNUSABLE,
                    message(Reason.NODES_UNUSABLE, detail="; ".join(unusable[:10])))
        vanished = [n for n in booking.existing_nodes if not self.state.node_exists(n)]
        for g in booking.groups:
            have = len(self.group_nodes(g))
            if have < g.count:
                names = ", ".join(self.state.vanished(g.key)) or "unknown names"
                vanished.append(f"{g.count - have} of {g.count} new node(s) of pool {g.pool} "
                                f"({names})")
        if vanished and self.state.synced["nodes"].is_set():
            return (ConditionType.CAPACITY_REVOKED, Reason.NODES_VANISHED,
                    message(Reason.NODES_VANISHED, detail=", ".join(vanished[:10])))
        booked_at = req.booked_at or self.clock.now()
        duration = self.config.booking.duration_seconds
        left = (booked_at + timedelta(seconds=duration) - self.clock.now()).total_seconds()
        if left <= 0 or expire:
            return (ConditionType.BOOKING_EXPIRED, Reason.RESERVATION_TIME_EXPIRED,
                    message(Reason.RESERVATION_TIME_EXPIRED, booked=scheduled, total=total,
                            seconds=duration))
        return None

    def unusable_booked_nodes(self, req: RequestRecord, booking: Booking) -> list[str]:
        """Booked existing nodes the gang's pods can no longer be scheduled on (a taint
        they do not tolerate, a cordon, a label their selector or topology needs changed),
        each with why; nodes already running the pods booked there are not asked."""
        if not booking.existing_nodes or not self.state.synced["nodes"].is_set():
            return []
        planned: dict[str, int] = {}
        for a in booking.plan.assignments:
            if a.node is not None:
                planned[a.node] = planned.get(a.node, 0) + a.pods
        scheduled = self.state.scheduled_consumers(req.key)
        waiting = {n for n, pods in planned.items()
                   if scheduled.get(n, 0) < pods and self.state.node_exists(n)}
        mode = self.config.classes.mode_for(req.class_name, req.parameters)
        if not waiting or mode is None:
            return []  # (checked first: every pod of the gang that lands wakes this)
        shapes = self._booked_shapes(req, mode)
        out: list[str] = []
        for a in booking.plan.assignments:
            node = self.state.node(a.node) if a.node in waiting else None
            shape = shapes.get(a.pod_set)
            if node is None or shape is None:
                continue
            why = _unusable_for(shape, node, a.domain)
            if why is not None:
                text = f"{node.metadata.name} ({why} of pod set {a.pod_set})"
                if not any(o.startswith(f"{node.metadata.name} (") for o in out):
                    out.append(text)
        return out

    def _booked_shapes(self, req: RequestRecord, mode: Mode) -> Mapping[str, PodShape]:
        """Pod set -> pod shape of a booked request, rebuilt only when the request, one of
        its templates or a DRA object changed: a gang's every pod that lands wakes it."""
        templates: list[object] = []
        for name in req.template_names:
            found = self.state.template(req.namespace, name)
            templates.append(found.metadata.resource_version if isinstance(found, PodTemplate)
                             else found)
        key = (req.resource_version, tuple(templates), self.state.dra.version)
        cached = self._shapes.get(req.key)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            gang = self.gang(req, mode)
        except Invalid:
            shapes: Mapping[str, PodShape] = {}  # stale_templates speaks for the templates
        else:
            shapes = {ps.name: ps.shape for ps in gang.pod_sets}
        if len(self._shapes) > 4096:
            self._shapes.clear()
        self._shapes[req.key] = (key, shapes)
        return shapes

    def consumed_elsewhere(self, req: RequestRecord, booking: Booking) -> dict[str, int]:
        """Node -> scheduled pods consuming this request on nodes the booking does not hold
        (a TAS assignment or the scheduler chose other free nodes)."""
        booked = set(booking.existing_nodes) | set(booking.acquired_nodes)
        for g in booking.groups:
            booked.update(self.group_nodes(g))
        return {n: c for n, c in self.state.scheduled_consumers(req.key).items()
                if n not in booked}

    def stale_templates(self, req: RequestRecord) -> tuple[Reason, list[str]] | None:
        """Whether the PodTemplates the booking was planned from are gone or changed."""
        text = req.annotations.get(TEMPLATES_ANNOTATION)
        if not text or not self.state.synced["podtemplates"].is_set():
            return None  # booked before Muster recorded templates, or the cache is cold
        try:
            recorded = {str(k): str(v) for k, v in json.loads(text).items()}
        except (ValueError, AttributeError):
            return None
        deleted, changed = stale_templates(
            recorded, self.template_digests(req.namespace, sorted(recorded))
        )
        if deleted:
            return Reason.TEMPLATE_DELETED, deleted
        if changed:
            return Reason.TEMPLATE_CHANGED, changed
        # Re-owned by another request: that request's now, and deleted with it.
        taken = []
        for name in sorted(recorded):
            found = self.state.template(req.namespace, name)
            if found is not None and not isinstance(found, TemplateError) and (
                other := foreign_request_owner(found.metadata.model_extra, req.uid)
            ) is not None:
                taken.append(f"{name} (now owned by ProvisioningRequest {other})")
        if taken:
            return Reason.TEMPLATE_CHANGED, taken
        return None

    async def end_booking(
        self,
        req: RequestRecord,
        booking: Booking,
        type_: ConditionType,
        reason: Reason,
        text: str,
    ) -> Delay:
        """Status first: the condition is the outcome (and makes the phase Ended); releasing
        and the phase annotation follow and are redone by :meth:`repair_ended` if cut short."""
        scheduled = self.state.scheduled_consumers(req.key)
        decide("end", req.key, condition=type_.value, reason=reason.value,
               scheduled=sum(scheduled.values()), of=req.total_pods,
               elsewhere=sum(self.consumed_elsewhere(req, booking).values()))
        req = await self.write_status(req, [(type_, True, reason, text)])
        crashpoints.reached("outcome-written")
        return await self._finish_ending(req, booking)

    async def _finish_ending(self, req: RequestRecord, booking: Booking | None) -> Delay:
        cond = req.ended_condition
        if booking is not None and cond is not None and (
            cond.get("reason") != Reason.BOOKING_CONSUMED
            or self.consumed_elsewhere(req, booking)
        ):
            await self.release_unused(booking, req.key)
        if req.annotated_phase is not Phase.ENDED:
            await self.persist(req, annotations={PHASE_ANNOTATION: Phase.ENDED})
        return None

    async def repair_ended(self, req: RequestRecord) -> Delay:
        """A booking that ended: finish what a crash or a failed write left undone."""
        booking = req.booking
        if req.ended_condition is None:
            # Phase Ended written by an earlier Muster, which wrote the status second.
            if booking is None:
                return None
            ending = self._ending(req, booking, expire=True)
            if ending is None:  # not with expire=True
                return None
            req = await self.write_status(req, [(ending[0], True, ending[1], ending[2])])
        elif req.annotated_phase is Phase.ENDED:
            return None
        return await self._finish_ending(req, booking)

    async def release_unused(
        self, booking: Booking, owner: str,
        why: str = "the booking ended and no pod or other booking uses them",
    ) -> int:
        """Release ``owner``'s groups none of whose nodes runs a pod or is counted on by
        another live booking (a request booked on existing nodes this one acquired); the
        collector handles the rest once they are idle."""
        others = self.state.booked_nodes(exclude=owner)
        unused = [
            g for g in booking.groups
            if (nodes := self.group_nodes(g))
            and not any(self.state.pods_on(n) or n in others for n in nodes)
        ]
        if not unused:
            return 0
        return await release_groups(
            unused, pools=self.state.pools(), provider_for=self.providers.for_pool,
            owner=owner, why=why, releasing=self.state.releasing, released=self.state.released,
        )

    def group_nodes(self, group: Group) -> tuple[str, ...]:
        """The group's registered nodes: found by the providerIDs the provider launched
        (a group persisted by an older Muster: by its names, else its key's label)."""
        return self.state.group_node_names(group)

    # ------------------------------------------------------------------ deletion

    async def finalize(self, req: RequestRecord) -> Delay:
        self.state.unreserve(req.key)
        booking = req.booking
        if booking is not None and req.phase is not Phase.FAILED:
            await self.release_unused(booking, req.key, why="the request is being deleted")
        if req.has_finalizer:
            await self.persist(req, annotations={}, finalizer=False)
        return None

    # ------------------------------------------------------------------ failure paths

    async def retry_or_fail(
        self,
        req: RequestRecord,
        *,
        attempt: int,
        reason: Reason,
        detail: str,
        permanent: bool = False,
        relax_time: datetime | None = None,
    ) -> Delay:
        """``relax_time``: when the request's topology may be relaxed; the next attempt is
        then no later than that."""
        self.state.unreserve(req.key)
        max_attempts = self.config.retry.max_attempts
        params = self.parameters(req)
        if not permanent and params.values.no_retry:
            what = ("Capacity is not found" if reason is Reason.CAPACITY_IS_NOT_FOUND
                    else f"Attempt {attempt} failed ({reason.value})")
            return await self.fail(
                req, reason, f"{what}: {detail}. {NO_RETRY} is set, so Muster does not retry.",
                attempt=attempt,
            )
        delay = self.config.retry.backoff(attempt)
        if relax_time is not None:
            delay = max(0.0, min(delay, (relax_time - self.clock.now()).total_seconds()))
        deadline = self.valid_until(req, params)
        if (not permanent and attempt < max_attempts and deadline is not None
                and self.clock.now() + timedelta(seconds=delay) > deadline):
            return await self.fail(
                req, Reason.RETRIES_EXHAUSTED,
                f"Capacity is not found within {VALID_UNTIL_SECONDS}="
                f"{params.values.valid_until_seconds} of the request's creation ({attempt} "
                f"attempt(s); the next would start after {rfc3339(deadline)}): {detail}. "
                "Free capacity or add stock, then recreate the request, or allow it longer.",
                attempt=attempt,
            )
        unready = req.unready_acquisitions + (reason is Reason.NODES_NOT_READY)
        limit = self.config.retry.max_unready_acquisitions
        if not permanent and reason is Reason.NODES_NOT_READY and unready >= limit:
            return await self.fail(
                req, Reason.RETRIES_EXHAUSTED,
                f"{unready} acquisition(s) gave nodes that were not Ready within "
                f"{self.config.acquisition.node_ready_timeout_seconds:.0f}s "
                f"(retry.max_unready_acquisitions {limit}; each was paid for, then released): "
                f"{detail}. Check the pool's node image and bootstrap, then recreate the "
                "request.",
                attempt=attempt,
            )
        if permanent or attempt >= max_attempts:
            final = Reason.RETRIES_EXHAUSTED if not permanent else reason
            text = (
                message(Reason.RETRIES_EXHAUSTED, attempts=attempt, detail=detail)
                if not permanent
                else f"{reason.value}: {detail}. Not retryable; fix the pool or provider."
            )
            return await self.fail(req, final, text, attempt=attempt)
        retry_at = self.clock.now() + timedelta(seconds=delay)
        req = await self.persist(
            req,
            annotations={
                ATTEMPT_ANNOTATION: str(attempt),
                UNREADY_ANNOTATION: str(unready) if unready else None,
                RETRY_AT_ANNOTATION: rfc3339(retry_at),
                PHASE_ANNOTATION: None,
                PLAN_ANNOTATION: None,
            },
        )
        fields = {"detail": detail, "attempt": attempt, "max_attempts": max_attempts,
                  "delay": delay}
        text = (
            message(Reason.ACQUISITION_FAILED, **fields)
            if reason is Reason.ACQUISITION_FAILED
            else message(reason, **fields)
            if reason in (Reason.CAPACITY_IS_NOT_FOUND, Reason.NAMESPACE_LIMIT_REACHED,
                          Reason.POOL_UNUSABLE)
            else message(reason, seconds=self.config.acquisition.node_ready_timeout_seconds,
                         detail=detail)
        )
        await self.write_status(
            req, [_accepted(), (ConditionType.PROVISIONED, False, reason, text)]
        )
        return delay

    async def fail(
        self, req: RequestRecord, reason: Reason, text: str, *, attempt: int | None = None
    ) -> Delay:
        """Failed=True first: it is the outcome and decides the phase. The annotations are
        then only cleaned up (plan dropped, so the cache stops holding it), and only when
        there is something to clean: a request failed before any plan costs one write."""
        self.state.unreserve(req.key)
        if not req.condition_true(ConditionType.FAILED):
            decide("fail", req.key, reason=reason.value, attempt=attempt, message=text)
        req = await self.write_status(
            req,
            [_accepted(), (ConditionType.PROVISIONED, False, reason, text),
             (ConditionType.FAILED, True, reason, text)],
        )
        crashpoints.reached("outcome-written")
        return await self._clean_failed(req, attempt=attempt)

    async def _clean_failed(self, req: RequestRecord, *, attempt: int | None = None) -> Delay:
        held = req.annotations
        if (PLAN_ANNOTATION in held or RETRY_AT_ANNOTATION in held
                or (PHASE_ANNOTATION in held and req.annotated_phase is not Phase.FAILED)):
            annotations: dict[str, str | None] = {
                PHASE_ANNOTATION: Phase.FAILED,
                PLAN_ANNOTATION: None,
                RETRY_AT_ANNOTATION: None,
            }
            if attempt is not None:
                annotations[ATTEMPT_ANNOTATION] = str(attempt)
            await self.persist(req, annotations=annotations)
        return None

    async def repair_failed(self, req: RequestRecord) -> Delay:
        """A failed request: finish what a crash or a failed write left undone."""
        self.state.unreserve(req.key)
        if not req.condition_true(ConditionType.FAILED):
            # Phase Failed written by an earlier Muster, which wrote the status second and
            # lost it: the reason is gone, so say what is known.
            last = req.condition(ConditionType.PROVISIONED) or {}
            try:
                reason = Reason(str(last.get("reason") or ""))
            except ValueError:
                reason = Reason.RETRIES_EXHAUSTED
            text = (f"Muster failed this request, but a crash lost the reason; the last "
                    f"status said: {last.get('message') or 'nothing'}. Recreate the request.")
            req = await self.write_status(
                req, [_accepted(), (ConditionType.PROVISIONED, False, reason, text),
                      (ConditionType.FAILED, True, reason, text)],
            )
        return await self._clean_failed(req)

    # ------------------------------------------------------------------ writes

    async def persist(
        self,
        req: RequestRecord,
        *,
        annotations: Mapping[str, str | None],
        finalizer: bool | None = None,
    ) -> RequestRecord:
        """Merge-patch annotations (None deletes) and add/remove Muster's finalizer.

        Changing finalizers carries the resourceVersion, so a concurrent writer's
        finalizer is never dropped (409 -> the key is reconciled again).
        """
        meta: dict[str, Any] = {"annotations": {k: (None if v is None else str(v))
                                                for k, v in annotations.items()}}
        if finalizer is not None and finalizer != req.has_finalizer:
            current = req.finalizers
            meta["finalizers"] = (
                [*current, FINALIZER] if finalizer else [f for f in current if f != FINALIZER]
            )
            meta["resourceVersion"] = req.resource_version
        body = await self.kube.merge_patch(
            PROVISIONING_REQUESTS, req.name, {"metadata": meta}, namespace=req.namespace
        )
        return self._store(body)

    async def write_status(
        self,
        req: RequestRecord,
        changes: list[tuple[ConditionType, bool, Reason, str]],
        *,
        details: Mapping[str, str] | None = None,
    ) -> RequestRecord:
        now = self.clock.now()
        conditions = [dict(c) for c in req.conditions]
        params = self.parameters(req)
        for type_, status, reason, text in changes:
            if params.ignored and type_ is ConditionType.ACCEPTED:
                text = f"{text} {params.note()}"
            elif params.ignored and type_ is ConditionType.PROVISIONED:
                # Kueue copies this message into the Workload's admission check.
                text = f"{text} {params.short_note()}"
            conditions = set_condition(
                conditions, type_=type_, status=status, reason=reason, message=text, now=now,
                generation=req.generation,
            )
        current_details = (req.body.get("status") or {}).get("provisioningClassDetails")
        if conditions == [dict(c) for c in req.conditions] and (
            details is None or dict(details) == current_details
        ):
            return req  # nothing would change: no write, no event
        patch: Body = {"conditions": conditions}
        if details is not None:
            patch["provisioningClassDetails"] = dict(details)
        body = await self.kube.patch_status(
            PROVISIONING_REQUESTS, req.name, patch, namespace=req.namespace
        )
        new = self._store(body)
        changed = transitions(req.conditions, conditions)
        if self.on_transition is not None and changed:
            self.on_transition(body, changed)
        if self.recorder is not None and params.ignored and any(
            t.type == ConditionType.ACCEPTED and t.status for t in changed
        ):
            self.recorder.event(body, "Warning", "ParametersIgnored", params.note())
        return new

    def _store(self, body: Body) -> RequestRecord:
        """The answer to a write, parsed and cached (unless the cache holds a newer one or
        saw the request deleted: the record then serves only the rest of this reconcile)."""
        stored = self.state.upsert_request(body) if body.get("metadata") else None
        return stored or RequestRecord.parse(body, self.state.request(object_key(body)))


def build_gang(req: RequestRecord, state: ClusterState, config: MusterConfig) -> GangRequest:
    """The request as the fit engine sees it, from ``state``'s templates, DRA objects and
    running pods (the controller's reconcile and ``kubectl muster fit`` alike);
    :class:`Invalid` names what is wrong."""
    mode = config.classes.mode_for(req.class_name, req.parameters) or Mode.PROVISION
    problems = read_parameters(req.parameters, mode, req.class_name).problems
    if problems:
        raise Invalid(Reason.INVALID_PARAMETERS, "; ".join(problems))
    try:
        relax_after(None, req.annotations, None)
    except ValueError as exc:
        raise Invalid(Reason.INVALID_PARAMETERS, str(exc)) from None
    try:
        pr = parse_object(ProvisioningRequest, dict(req.body))
    except SnapshotError as exc:
        raise Invalid(Reason.INVALID_PARAMETERS, str(exc)) from None
    templates = {}
    for i, ps in enumerate(pr.spec.pod_sets):
        ref = ps.pod_template_ref.name
        found = state.template(req.namespace, ref)
        if found is None:
            raise Invalid(
                Reason.FAILED_TO_CREATE_PODS,
                f"spec.podSets[{i}]: PodTemplate {req.namespace}/{ref} not found",
                missing=(f"PodTemplate {req.namespace}/{ref}",),
            )
        if isinstance(found, TemplateError):
            # It exists: the API server would refuse its pods, so the request itself must
            # change, as for every other field the API server refuses (pod_template_problems).
            raise Invalid(
                Reason.INVALID_PARAMETERS,
                f"spec.podSets[{i}]: PodTemplate {req.namespace}/{ref} is invalid: "
                f"{found.detail}",
            )
        other = foreign_request_owner(found.metadata.model_extra, req.uid)
        if other is not None:
            raise Invalid(
                Reason.INVALID_PARAMETERS,
                f"spec.podSets[{i}]: PodTemplate {req.namespace}/{ref} belongs to "
                f"ProvisioningRequest {other}, not to this request; a request plans only "
                "from PodTemplates no other request owns",
            )
        templates[ref] = found
    try:
        every = any(needs_running_pods(t.template.spec) for t in templates.values())
        gang = gang_of(pr, templates, state.levels, state.dra.catalog(),
                       state.bound_pods(every=every))
    except InvalidTemplate as exc:
        raise Invalid(Reason.INVALID_PARAMETERS, str(exc)) from None
    except SnapshotError as exc:
        raise Invalid(Reason.FAILED_TO_CREATE_PODS, str(exc)) from None
    _refuse_missing_claim_objects(gang)
    for pod_set in gang.pod_sets:
        level = pod_set.topology.level
        if level is not None and level not in state.levels:
            raise Invalid(
                Reason.INVALID_PARAMETERS,
                f"pod set {pod_set.name} asks for topology level {level!r}, which is not "
                f"configured (levels: {', '.join(state.levels)})",
            )
    return gang


def _refuse_missing_claim_objects(gang: GangRequest) -> None:
    """:class:`Invalid` naming the ResourceClaimTemplates, ResourceClaims and DeviceClasses
    the gang's pods claim through that the cache does not hold. Created by a later apply
    (or come through a watch behind the request's), they are waited for like a
    PodTemplate: never an invalid request."""
    missing = [(pod_set.name, claim) for pod_set in gang.pod_sets
               for claim in pod_set.shape.claims if claim.missing]
    if missing:
        raise Invalid(
            Reason.FAILED_TO_CREATE_PODS,
            "; ".join(f"pod set {name}: {claim.error}" for name, claim in missing),
            missing=tuple(dict.fromkeys(m for _, claim in missing for m in claim.missing)),
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


def _waiting_reason(req: RequestRecord) -> Reason | None:
    cond = req.condition(ConditionType.PROVISIONED)
    try:
        return Reason(str((cond or {}).get("reason") or ""))
    except ValueError:
        return None


def _accepted() -> tuple[ConditionType, bool, Reason, str]:
    return (ConditionType.ACCEPTED, True, Reason.ACCEPTED, message(Reason.ACCEPTED))


def _unusable_for(shape: PodShape, node: Node, domain: Mapping[str, str]) -> str | None:
    """Why pods of ``shape`` can no longer be scheduled on ``node``, booked for them in the
    topology ``domain``, or None. The taints of node conditions (not-ready, pressure) are
    left out: the lifecycle controller lifts them when the condition clears, and a node
    that stays NotReady is no longer planned on anyway."""
    name = node.metadata.name
    taints = [Taint(t.key, t.value, t.effect) for t in node.spec.taints
              if t.key not in CONDITION_TAINTS and t.key != UNSCHEDULABLE]
    if node.spec.unschedulable:
        taints.append(Taint(UNSCHEDULABLE, "", "NoSchedule"))
    bad = untolerated(tuple(taints), shape.tolerations, bound=shape.node_name is not None)
    if bad:
        t = bad[0]
        if t.key == UNSCHEDULABLE:
            return "cordoned, not tolerated by the pods"
        value = f"={t.value}" if t.value else ""
        return f"taint {t.key}{value}:{t.effect} not tolerated by the pods"
    labels = node.metadata.labels
    if not selector_matches(shape, labels, name):
        return "its labels no longer match the node selector or affinity"
    moved = sorted(k for k, v in domain.items() if labels.get(k) != v)
    if moved:
        return f"label {moved[0]} is no longer {domain[moved[0]]!r}, the booked domain"
    return None


def class_details(
    plan: Plan, observed: Mapping[tuple[str, str], str] | None = None
) -> dict[str, str]:
    """``provisioningClassDetails``: where the gang goes, in keys Kueue can copy into
    nodeSelectors (``valueFromProvisioningClassDetail``): the chosen domain of the widest
    constrained pod set under ``muster.dev/topology-level``/``-domain`` and, per level, the
    level's node label -> value.

    A placeholder domain (a pool without declared domains) is published as the value its
    nodes registered with (``observed``: (label, placeholder) -> value); one no node
    carries is left out, never published: no node would match it."""
    seen = observed or {}
    placed = [_observed_placement(p, seen) for p in plan.placements
              if p.level and p.domain_labels]
    details: dict[str, str] = {}
    if placed:
        main = placed[0]
        if main.domain is not None:
            details[TOPOLOGY_LEVEL_DETAIL] = str(main.level)
            details[TOPOLOGY_DOMAIN_DETAIL] = str(main.domain)
        # Kueue copies a level's key into every pod set's nodeSelector, so a level is only
        # published when every constrained pod set (e.g. every TAS slice) shares its value.
        details.update({
            k: str(v) for k, v in main.domain_labels.items()
            if all(p.domain_labels.get(k) == v for p in placed)
        })
    for p in placed:
        details[f"muster.dev/podset.{p.pod_set}"] = ",".join(
            f"{k}={v}" for k, v in p.domain_labels.items()
        )
    new_nodes = sum(n.count for n in plan.new_nodes)
    details[NEW_NODES_DETAIL] = str(new_nodes)
    return dict(list(details.items())[:64])


def _observed_placement(
    p: PodSetPlacement, seen: Mapping[tuple[str, str], str]
) -> PodSetPlacement:
    """``p`` with its placeholder domain values replaced by those observed, or dropped."""
    labels = {k: seen.get((k, v), v) for k, v in p.domain_labels.items()}
    labels = {k: v for k, v in labels.items() if not placeholder(v)}
    domain = p.domain
    if domain is not None and p.level is not None and placeholder(domain):
        domain = seen.get((p.level, domain))
    return replace(p, domain_labels=labels, domain=domain)


def _group_text(group: Group) -> str:
    where = ",".join(f"{k.rsplit('/', 1)[-1]}={v}" for k, v in sorted(group.domain.items()))
    return f"{group.pool}[{where or '-'}]x{group.count}"


def _where(plan: Plan) -> str:
    parts = []
    for p in plan.placements:
        if p.level and p.domain:
            parts.append(f"pod set {p.pod_set} in {p.level.rsplit('/', 1)[-1]} {p.domain}")
        elif p.level:
            level = p.level.rsplit("/", 1)[-1]
            parts.append(f"pod set {p.pod_set} across {p.domains_used} {level}(s)")
        else:
            parts.append(f"pod set {p.pod_set} without topology constraint")
    return "; ".join(parts) or "no pods"
