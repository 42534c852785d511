"""What every step of the reconcile shares: its collaborators, the reads of a request
(parameters, gang, templates) and the two writes, annotations (:meth:`StepsBase.persist`) and
status (:meth:`StepsBase.write_status`); the order of the two is
:mod:`controller.lifecycle`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controller import lifecycle
from controller.acquire.providers import ProviderSet
from controller.api.parameters import Parameters, read_parameters
from controller.common.clock import Clock
from controller.common.conditions import (
    ConditionType,
    Reason,
    Transition,
    message,
    set_condition,
    transitions,
)
from controller.config import MusterConfig
from controller.fit.types import GangRequest, Mode, Plan, PodShape
from controller.kube import Body, KubeClient
from controller.kube.events import EventRecorder
from controller.kube.resources import PROVISIONING_REQUESTS
from controller.lifecycle import FINALIZER, Event, Row
from controller.reconcilers.provisioning.gang import build_gang
from controller.state.bookings import Group, template_digest
from controller.state.cache import ClusterState
from controller.state.object_store import TemplateError, object_key
from controller.state.planner import Planner
from controller.state.requests import RequestRecord
from controller.state.wakeups import Wakeups

Delay = float | None


class StepsBase:
    """The collaborators and shared reads and writes of every step."""

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
        self.table: Sequence[Row] = lifecycle.TABLE
        """The transitions the reconcile may take (:mod:`controller.lifecycle`)."""

    def take(self, req: RequestRecord, event: Event) -> Row:
        """The table's row for ``event`` in ``req``'s phase: every transition goes through
        here, and one the table does not hold raises :class:`NotInTable`."""
        return lifecycle.take(req.phase, event, self.table)

    def gang(self, req: RequestRecord, mode: Mode) -> GangRequest:
        """The request as the fit engine sees it; :class:`Invalid` names what is wrong."""
        return build_gang(req, self.state, self.config)

    def parameters(self, req: RequestRecord) -> Parameters:
        """The request's parameters as Muster reads them (see
        :mod:`controller.api.parameters`)."""
        mode = self.config.classes.mode_for(req.class_name, req.parameters) or Mode.PROVISION
        return read_parameters(req.parameters, mode, req.class_name)

    def template_digests(self, namespace: str, names: Sequence[str]) -> dict[str, str | None]:
        """PodTemplate name -> digest of its content now (None: missing; a template the
        cache could not parse digests its error)."""
        out: dict[str, str | None] = {}
        for name in names:
            found = self.state.objects.template(namespace, name)
            if found is None:
                out[name] = None
            elif isinstance(found, TemplateError):
                out[name] = template_digest({"invalid": found.detail})
            else:
                out[name] = template_digest(found.template.model_dump(mode="json",
                                                                      by_alias=True))
        return out

    def _template_annotations(self, req: RequestRecord) -> list[Mapping[str, str]]:
        """The annotations of the PodTemplate of each of ``req``'s pod sets, in order."""
        notes: list[Mapping[str, str]] = []
        for ps in (req.body.get("spec") or {}).get("podSets") or []:
            ref = (ps.get("podTemplateRef") or {}).get("name") if isinstance(ps, dict) else None
            found = self.state.objects.template(req.namespace, str(ref))
            notes.append(found.template.metadata.annotations
                         if found is not None and not isinstance(found, TemplateError) else {})
        return notes

    def group_nodes(self, group: Group) -> tuple[str, ...]:
        """The group's registered nodes: found by the providerIDs the provider launched
        (a group persisted by an older Muster: by its names, else its key's label)."""
        return self.state.objects.group_node_names(group)

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
        return stored or RequestRecord.parse(body, self.state.objects.request(object_key(body)))


def _accepted() -> tuple[ConditionType, bool, Reason, str]:
    return (ConditionType.ACCEPTED, True, Reason.ACCEPTED, message(Reason.ACCEPTED))


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
