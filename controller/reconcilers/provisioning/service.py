"""The ProvisioningRequest reconcile: one level-triggered step per request key.

:meth:`ProvisioningService.reconcile` reads the request from the cache and takes the step
:data:`controller.lifecycle.STEPS` names for its phase; every transition a step takes is a
row of :data:`controller.lifecycle.TABLE` (:meth:`~StepsBase.take`). The steps live by phase
in this package, each class extending the one whose steps it hands over to:

* :mod:`.plan` (new): validate, plan and book through the single :class:`Planner`, persist
  the plan and the idempotency keys, then confirm (fits existing nodes) or acquire;
* :mod:`.acquire` (Acquiring): acquire every group all or nothing, register the nodes and
  wait bounded for Ready; resumed with the same keys after a restart, so nothing is
  acquired twice;
* :mod:`.confirm`: Provisioned=True with the placement, then phase Booked;
* :mod:`.booking` (Booked, Ended, deleting): end the booking when the pods are all
  scheduled, the booking time passed, its templates changed or booked nodes vanished or
  became unusable; release what the gang never used;
* :mod:`.outcome`: retry with exponential backoff up to ``retry.max_attempts``, else Failed;
* :mod:`.base`: the reads every step shares and the two writes (annotations, status).

All time comes from the injected clock. Muster's own watch (:mod:`controller.state.feeds`)
feeds the cache and enqueues keys; nothing else reaches the service.
"""

from __future__ import annotations

from controller import lifecycle
from controller.common.conditions import ConditionType, Reason
from controller.kube import ApiError
from controller.kube.resources import PROVISIONING_REQUESTS
from controller.lifecycle import PLAN_ANNOTATION, Phase, Step
from controller.reconcilers import queued
from controller.reconcilers.provisioning.base import Delay
from controller.reconcilers.provisioning.plan import Planning
from controller.state.bookings import Booking
from controller.state.requests import RequestRecord

WAITING_REASONS = frozenset({
    Reason.CAPACITY_IS_NOT_FOUND, Reason.NAMESPACE_LIMIT_REACHED, Reason.POOL_UNUSABLE,
    Reason.QUEUED_FOR_CAPACITY,
})
"""A request whose last attempt ended so waits for something Muster sees change."""


class ProvisioningService(Planning):
    """The reconcile's entry point; its steps come from the classes it extends."""

    async def reconcile(self, key: str) -> Delay:
        """Take the next step for ``key``; a write that lost a race (409) or hit a deleted
        object (404) refreshes the cached object and tries again at once."""
        try:
            return await self._reconcile(key)
        except ApiError as exc:
            # A plan reserved in memory but not persisted must not hold capacity meanwhile;
            # a persisted one is still booked through its annotation.
            self.state.ledger.unreserve(key)
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
        req = self.state.objects.request(key)
        if req is None:
            self.state.ledger.unreserve(key)
            return None
        mode = self.config.classes.mode_for(req.class_name, req.parameters)
        if mode is None:
            return None
        step = lifecycle.step_for(req.phase, deleting=req.deleting)
        if step is Step.FINALIZE:
            return await self.finalize(req)
        if step is Step.REPAIR_FAILED:
            return await self.repair_failed(req)
        if step in (Step.REPAIR_ENDED, Step.HOLD):
            done, left = await queued.expire_run(self, req)
            if done:
                return None
            then = await (self.repair_ended(req) if step is Step.REPAIR_ENDED
                          else self.check_booking(req))
            return left if then is None else then if left is None else min(then, left)
        if step is Step.ACQUIRE:
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
            req for req in self.state.objects.requests().values()
            if req.retry_at is not None and not req.deleting
            and req.annotated_phase is Phase.NEW and _waiting_reason(req) in WAITING_REASONS
        ]
        waiting.sort(key=lambda req: self.plan_order(req, now))
        return [req.key for req in waiting]

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
        current = self.state.objects.request(req.key)
        if current is None:  # seen deleted meanwhile
            return None
        if current.phase is not Phase.ACQUIRING or current.booking is None:
            return 0.0  # the next reconcile takes it from its real phase
        return await self.acquire(current, current.booking)


def _waiting_reason(req: RequestRecord) -> Reason | None:
    cond = req.condition(ConditionType.PROVISIONED)
    try:
        return Reason(str((cond or {}).get("reason") or ""))
    except ValueError:
        return None
