"""New requests: validate, plan and book through the single :class:`Planner`, persist the plan
(phase Acquiring), then confirm or acquire; a plan refused or without fit retries or fails.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from controller.acquire.keys import groups_for
from controller.api.parameters import RELAX_TOPOLOGY_AFTER
from controller.common import crashpoints
from controller.common.conditions import Reason, message, rfc3339
from controller.common.decision_log import log_decision
from controller.fit.explain import shortfall
from controller.fit.types import GangRequest, Mode, NoFit, Plan, ReasonCode
from controller.inputs.relaxation import alternatives, hold_until
from controller.lifecycle import (
    ATTEMPT_ANNOTATION,
    PHASE_ANNOTATION,
    PLAN_ANNOTATION,
    RETRY_AT_ANNOTATION,
    TEMPLATES_ANNOTATION,
    Event,
    Phase,
)
from controller.reconcilers.provisioning.acquire import Acquisition
from controller.reconcilers.provisioning.base import Delay, _group_text, _where
from controller.reconcilers.provisioning.gang import Invalid
from controller.state.bookings import Booking
from controller.state.planner import Refusal
from controller.state.requests import RequestRecord
from controller.state.tenancy import exceeded

ARRIVAL_POLL_SECONDS = 0.5


class Planning(Acquisition):
    """Plan, book and persist a new request."""

    def plan_order(self, req: RequestRecord, now: datetime) -> tuple[Any, ...]:
        """Where ``req`` goes in a planner pass (``retry.replan_order``): by arrival, or by
        when its backoff timer fires (a request planned now, new or due, before those still
        waiting: the order the timers alone would plan them in), then by arrival."""
        arrival = self.state.objects.arrival(req.key)
        if self.config.retry.replan_order == "arrival":
            return arrival
        due = req.retry_at if req.retry_at is not None and req.retry_at > now else now
        return (due, *arrival)

    async def provision(self, req: RequestRecord, mode: Mode, *, woken: bool = False) -> Delay:
        """``woken``: planned ahead of its backoff timer because capacity may have freed
        (:class:`Wakeups`); if it still does not fit, nothing is written and the timer
        stands."""
        now = self.clock.now()
        retry_at = req.retry_at
        waiting = retry_at is not None and retry_at > now
        if retry_at is not None and waiting and not woken:
            self.take(req, Event.BACKING_OFF)
            return (retry_at - now).total_seconds()
        try:
            gang = self.gang(req, mode)
        except Invalid as exc:
            if exc.missing:
                wait = self.arrival_grace_left(req)
                if wait > 0:
                    # Its arrival (the cache's watch event) reconciles the request at once;
                    # the timer only ends the wait.
                    self.take(req, Event.AWAITING_OBJECTS)
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
            self.take(req, Event.STILL_NO_FIT)
            return max(0.0, (retry_at - self.clock.now()).total_seconds())
        if isinstance(result, Refusal):
            if result.wait:
                return await self.retry_or_fail(
                    req, attempt=attempt, reason=result.reason, detail=result.text
                )
            return await self.fail(req, result.reason, result.text)
        if isinstance(result, NoFit):
            return await self.no_fit(req, gang, mode, result, attempt, relax_time=relax_time)
        booking = self.state.ledger.bookings().get(req.key)
        if booking is None:  # the request was deleted while it was being planned
            return None
        log_decision("plan", req.key, outcome="fits", attempt=attempt, where=_where(result),
               existing_nodes=len(set(booking.existing_nodes)),
               new_nodes=sum(g.count for g in booking.groups),
               groups=[_group_text(g) for g in booking.groups],
               cost_per_hour=round(result.cost_per_hour, 4))
        # Persisted as Acquiring even with no new nodes: should the status write that
        # confirms it fail or the process die first, the resumed "acquisition" of nothing
        # confirms it. (Persisting it as Booked left a booking that expired without
        # Provisioned=True ever written.) Only acquired nodes need the release finalizer.
        self.take(req, Event.PLANNED)
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
        log_decision("plan", req.key, outcome="no-fit", attempt=attempt, permanent=result.permanent,
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
                self.take(req, Event.AWAITING_OBJECTS)
                self.state.wait_for(req.key, ("CapacityPool", "Node"))
                return min(wait, ARRIVAL_POLL_SECONDS)
            return await self.fail(req, reason, message(reason, detail=detail))
        return await self.retry_or_fail(
            req, attempt=attempt, reason=Reason.CAPACITY_IS_NOT_FOUND, detail=detail
        )
