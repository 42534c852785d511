"""Provisioned=True: the one status write that turns a persisted plan (phase Acquiring) into
a booking, the placement it publishes (``provisioningClassDetails``), then phase Booked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from controller.acquire.registration import observed_domain, placeholder
from controller.common import crashpoints
from controller.common.conditions import ConditionType, Reason, message
from controller.fit.types import GangRequest, Mode, Plan, PodSetPlacement
from controller.inputs.relaxation import (
    RELAXED_DETAIL,
    pools_default,
    relax_after,
    relax_at,
    relaxable,
    relaxed_placements,
)
from controller.inputs.relaxation import describe as describe_relaxed
from controller.inputs.relaxation import detail as relaxed_detail
from controller.lifecycle import PHASE_ANNOTATION, Event, Phase
from controller.reconcilers.provisioning.base import Delay, _accepted, _where
from controller.reconcilers.provisioning.gang import Invalid
from controller.reconcilers.provisioning.outcome import Outcomes
from controller.state.bookings import Booking
from controller.state.requests import RequestRecord

TOPOLOGY_LEVEL_DETAIL = "muster.dev/topology-level"

TOPOLOGY_DOMAIN_DETAIL = "muster.dev/topology-domain"

NEW_NODES_DETAIL = "muster.dev/new-nodes"


class Confirmation(Outcomes):
    """Provisioned=True, then phase Booked."""

    async def confirm(self, req: RequestRecord, booking: Booking) -> Delay:
        """Set Provisioned=True with the placement: the one write that turns a persisted
        plan (phase Acquiring) into a booking."""
        self.take(req, Event.CONFIRMED)
        reason = Reason.CAPACITY_IS_PROVISIONED if booking.groups else Reason.CAPACITY_IS_FOUND
        try:
            seen = self.observed_domains(booking)
            details = class_details(booking.plan, seen)
            where = _where_observed(booking.plan, seen)
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
            self.state.ledger.unreserve(req.key)
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

    def relaxation(self, req: RequestRecord, gang: GangRequest) -> tuple[
            dict[str, str], datetime | None]:
        """The pod sets of ``gang`` Muster may relax (name -> required level) and when it
        may (None: never); see :mod:`controller.inputs.relaxation`."""
        sets = relaxable(gang, self._template_annotations(req), self.state.levels)
        default = pools_default(gang, sets, self.state.pool_registry.pools().values(),
                                self.config.topology.relax_after_seconds)
        seconds = relax_after(self.parameters(req).values.relax_topology_after_seconds,
                              req.annotations, default)
        when = relax_at(req.created_at, seconds)
        if when is None or not sets:
            return {}, None
        return sets, when

    def observed_domains(self, booking: Booking) -> dict[tuple[str, str], str]:
        """(label, placeholder value) -> the value the nodes of the booking's groups
        registered with (pools without declared domains)."""
        out: dict[tuple[str, str], str] = {}
        for group in booking.groups:
            nodes = [n for name in self.state.objects.group_node_names(group)
                     if (n := self.state.objects.node(name)) is not None]
            if nodes:
                out.update(observed_domain(group, nodes))
        return out


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


def _where_observed(plan: Plan, observed: Mapping[tuple[str, str], str]) -> str:
    """Where the plan puts each pod set, a placeholder domain named as its nodes registered
    it (a new domain of the level, when they did not say)."""
    parts = []
    for p in plan.placements:
        if p.level and p.domain and placeholder(p.domain):
            level = p.level.rsplit("/", 1)[-1]
            p = _observed_placement(p, observed)
            if p.domain is None:
                parts.append(f"pod set {p.pod_set} in a new {level}")
                continue
        parts.append(_where(replace(plan, placements=(p,))))
    return "; ".join(parts) or "no pods"


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
