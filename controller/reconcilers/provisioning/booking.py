"""A booked request: hold the booking until its pods are all scheduled, it expires, or its
templates or nodes stop serving it; then end it (status first) and release the groups no pod
uses. Deletion releases the same way and drops the finalizer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import timedelta

from controller.acquire.groups import release_groups
from controller.api.node import Node
from controller.api.pod import PodTemplate
from controller.common import crashpoints
from controller.common.conditions import ConditionType, Reason, message
from controller.common.decision_log import log_decision
from controller.fit.shapes import selector_matches, untolerated
from controller.fit.taints import CONDITION_TAINTS, UNSCHEDULABLE
from controller.fit.types import Mode, PodShape, Taint
from controller.lifecycle import PHASE_ANNOTATION, TEMPLATES_ANNOTATION, Event, Phase
from controller.reconcilers import queued
from controller.reconcilers.provisioning.base import Delay
from controller.reconcilers.provisioning.confirm import Confirmation
from controller.reconcilers.provisioning.gang import Invalid
from controller.state.bookings import Booking, stale_templates
from controller.state.object_store import TemplateError
from controller.state.requests import RequestRecord
from controller.state.tenancy import foreign_request_owner

log = logging.getLogger(__name__)


class Bookings(Confirmation):
    """Hold, end and release a booking; finalize a deleted request."""

    async def check_booking(self, req: RequestRecord) -> Delay:
        booking = req.booking
        if booking is None:
            return None
        if not req.condition_true(ConditionType.PROVISIONED):
            # Persisted as Booked by an earlier Muster whose status write never landed.
            return await self.confirm(req, booking)
        req = await self.mark_booked(req)
        ending = self._ending(req, booking)
        self.take(req, Event.HOLDING if ending is None else Event.ENDED)
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
        scheduled = sum(self.state.objects.scheduled_consumers(req.key).values())
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
        vanished = [n for n in booking.existing_nodes if not self.state.objects.node_exists(n)]
        for g in booking.groups:
            have = len(self.group_nodes(g))
            if have < g.count:
                names = ", ".join(self.state.objects.vanished(g.key)) or "unknown names"
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
        scheduled = self.state.objects.scheduled_consumers(req.key)
        waiting = {n for n, pods in planned.items()
                   if scheduled.get(n, 0) < pods and self.state.objects.node_exists(n)}
        mode = self.config.classes.mode_for(req.class_name, req.parameters)
        if not waiting or mode is None:
            return []  # (checked first: every pod of the gang that lands wakes this)
        shapes = self._booked_shapes(req, mode)
        out: list[str] = []
        for a in booking.plan.assignments:
            node = self.state.objects.node(a.node) if a.node in waiting else None
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
            found = self.state.objects.template(req.namespace, name)
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
        return {n: c for n, c in self.state.objects.scheduled_consumers(req.key).items()
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
            found = self.state.objects.template(req.namespace, name)
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
        scheduled = self.state.objects.scheduled_consumers(req.key)
        log_decision("end", req.key, condition=type_.value, reason=reason.value,
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
        self.take(req, Event.REPAIRED)
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
            and not any(self.state.objects.pods_on(n) or n in others for n in nodes)
        ]
        if not unused:
            return 0
        return await release_groups(
            unused, pools=self.state.pool_registry.pools(), provider_for=self.providers.for_pool,
            owner=owner, why=why, ledger=self.state.ledger,
        )

    async def finalize(self, req: RequestRecord) -> Delay:
        self.take(req, Event.DELETED)
        self.state.ledger.unreserve(req.key)
        refused = await queued.leave(self, req)
        if refused:
            # The finalizer stays: once the request is gone nothing would cancel them.
            log.warning("%s: deleting, but the cloud refused to cancel its queued request "
                        "(%s); trying again", req.key, "; ".join(refused))
            return self.config.acquisition.queue_poll_seconds
        booking = req.booking
        if booking is not None and req.phase is not Phase.FAILED:
            await self.release_unused(booking, req.key, why="the request is being deleted")
        if req.has_finalizer:
            await self.persist(req, annotations={}, finalizer=False)
        return None


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
