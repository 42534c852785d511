"""Muster's admission check (path B): the Workload reconciler and the AdmissionCheck
reconciler.

For every Workload with reserved quota whose check (an AdmissionCheck with Muster's
controllerName) is Pending, Muster creates and owns a ProvisioningRequest named like
Kueue's (``<workload>-<check>-<attempt>``) plus its PodTemplates, then maps the request's
conditions to the check state exactly as Kueue's built-in controller does
(:func:`controller.kueue.decisions.verdict`), adding on Ready the podSetUpdates that pin
each constrained pod set to the domain Muster booked. ``status.admissionChecks`` is written
read-modify-write with the Workload's resourceVersion (a 409 re-reads and retries), so
other checks' entries are never clobbered: a merge patch would replace the whole list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.common.clock import Clock
from controller.common.conditions import rfc3339
from controller.common.topology_defaults import POOL_LABEL
from controller.config import KueueConfig
from controller.inputs.snapshot import pod_set_name
from controller.kube import ApiError, Body, KubeClient
from controller.kube.events import EventRecorder, EventType, ObjectReference
from controller.kube.resources import POD_TEMPLATES, PROVISIONING_REQUESTS
from controller.kueue.decisions import (
    PENDING,
    PERMANENT_FAILURES,
    PODSET_DETAIL_PREFIX,
    READY,
    REJECTED,
    RETRY,
    CheckVerdict,
    MergeConflict,
    PodSetTarget,
    attempt_of,
    parse_domain_detail,
    pod_set_updates,
    request_name,
    same_state,
    set_check_state,
    taint_tolerations,
    tolerates,
    verdict,
)
from controller.kueue.drafts import (
    DraftError,
    RequestDraft,
    draft_request,
    owner_reference,
    pod_template_body,
    request_body,
    workload_of,
)
from controller.kueue.facts import PoolFacts, WatchedFacts
from controller.kueue.models import (
    GROUP,
    AdmissionCheck,
    AdmissionCheckState,
    PodSet,
    PodSetUpdate,
    ProvisioningRequestConfig,
    ResourceFlavor,
    Workload,
)
from controller.kueue.resources import ADMISSION_CHECKS, WORKLOADS
from controller.state.bookings import Booking
from controller.state.requests import RequestRecord

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5
TEMPLATE_WAIT_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Inactive:
    """Why one of Muster's AdmissionChecks cannot serve (its ``Active=False`` message)."""

    message: str


class KueueCache:
    """What the reconcilers read: the watched Kueue objects and Muster's requests, nodes
    and pools. Filled by :class:`controller.kueue.integration.KueueIntegration`."""

    def __init__(self) -> None:
        self.workloads: dict[str, Body] = {}
        self.checks: dict[str, Body] = {}
        self.flavors: dict[str, Body] = {}
        self.configs: dict[str, Body] = {}
        self.requests: dict[str, RequestRecord] = {}
        """Muster-created requests by ``namespace/name``, parsed once as they arrive."""
        self.facts: PoolFacts = WatchedFacts()
        """CapacityPools and which node each one made (see :mod:`controller.kueue.facts`)."""


class CheckReconciler:
    def __init__(
        self,
        *,
        kube: KubeClient,
        cache: KueueCache,
        config: KueueConfig,
        clock: Clock,
        events: EventRecorder,
    ) -> None:
        self.kube = kube
        self.events = events
        self.cache = cache
        self.config = config
        self.clock = clock
        self.written: dict[str, str] = {}
        """Workload key -> resourceVersion of our last status write (its watch echo needs
        no reconcile)."""

    # ------------------------------------------------------------------ AdmissionChecks

    def ours(self, ac: Mapping[str, Any]) -> bool:
        return (ac.get("spec") or {}).get("controllerName") == self.config.controller_name

    def parameters_problem(self, ac: AdmissionCheck) -> Inactive | None:
        ref = ac.spec.parameters
        if ref is None:
            return None
        if ref.api_group != GROUP or ref.kind != "ProvisioningRequestConfig":
            return Inactive(
                f"spec.parameters must reference a {GROUP} ProvisioningRequestConfig, "
                f"got {ref.api_group}/{ref.kind}"
            )
        if ref.name not in self.cache.configs:
            return Inactive(f"ProvisioningRequestConfig {ref.name} not found")
        return None

    async def reconcile_check(self, name: str) -> None:
        """Set ``Active`` on one of Muster's AdmissionChecks (a ClusterQueue with an
        inactive check admits nothing)."""
        body = self.cache.checks.get(name)
        if body is None or not self.ours(body):
            return
        try:
            ac = AdmissionCheck.model_validate(body)
            problem = self.parameters_problem(ac)
        except ValueError as exc:
            problem = Inactive(f"invalid AdmissionCheck: {str(exc).splitlines()[0]}")
        status, reason, text = (
            ("True", "Active", "Muster serves this admission check.")
            if problem is None else ("False", "BadParametersRef", problem.message)
        )
        conditions = [dict(c) for c in (body.get("status") or {}).get("conditions") or []]
        old = next((c for c in conditions if c.get("type") == "Active"), None)
        if old and (old.get("status"), old.get("reason"), old.get("message")) == (
            status, reason, text
        ):
            return
        ltt = old.get("lastTransitionTime") if old and old.get("status") == status else None
        new = {
            "type": "Active", "status": status, "reason": reason, "message": text,
            "lastTransitionTime": ltt or rfc3339(self.clock.now()),
            "observedGeneration": (body.get("metadata") or {}).get("generation") or 1,
        }
        conditions = [c for c in conditions if c.get("type") != "Active"] + [new]
        patch = {"metadata": {"resourceVersion": body["metadata"].get("resourceVersion")},
                 "status": {"conditions": conditions}}
        try:
            updated = await self.kube.merge_patch(
                ADMISSION_CHECKS, name, patch, subresource="status"
            )
        except ApiError as exc:
            if exc.conflict or exc.not_found:
                return  # the watch delivers the newer object and we run again
            raise
        self.cache.checks[name] = updated

    # ------------------------------------------------------------------ Workloads

    def our_checks(self, wl: Workload) -> list[str]:
        return [
            s.name for s in wl.status.admission_checks
            if s.name in self.cache.checks and self.ours(self.cache.checks[s.name])
        ]

    def owned_requests(self, wl: Workload) -> list[RequestRecord]:
        uid = wl.metadata.uid
        ns = wl.metadata.namespace or "default"
        return [
            r for r in self.cache.requests.values()
            if r.namespace == ns and workload_of(r.body)[1] == uid
        ]

    async def reconcile_workload(self, key: str) -> float | None:
        body = self.cache.workloads.get(key)
        if body is None:
            return None  # its requests go with it (Workload -> templates -> request)
        try:
            wl = Workload.model_validate(body)
        except ValueError as exc:
            log.warning("Workload %s is unreadable, skipping: %s", key, exc)
            return None
        checks = self.our_checks(wl)
        if not checks:
            return None
        if (
            wl.metadata.deletion_timestamp
            or wl.condition_true("Finished")
            or wl.condition_true("Evicted")
            or not wl.condition_true("QuotaReserved")
        ):
            # Kueue's CleanupProvisioningRequestsOnEviction: requests of a Workload that
            # lost its quota, finished or is going away release their booking now.
            if wl.metadata.deletion_timestamp or wl.condition_true("Finished") or (
                wl.condition_true("Evicted")
            ):
                await self.delete_requests(self.owned_requests(wl))
            return None
        delays = [d for check in checks
                  if (d := await self.reconcile_one(wl, check)) is not None]
        return min(delays, default=None)

    async def delete_requests(self, requests: Sequence[RequestRecord]) -> None:
        for r in requests:
            await self.kube.delete(PROVISIONING_REQUESTS, r.name, namespace=r.namespace)

    def prc_for(self, check: str) -> ProvisioningRequestConfig | Inactive | None:
        """The check's ProvisioningRequestConfig, None when it has none, or why the check
        cannot serve."""
        ac = AdmissionCheck.model_validate(self.cache.checks[check])
        problem = self.parameters_problem(ac)
        if problem is not None:
            return problem
        if ac.spec.parameters is None:
            return None
        try:
            return ProvisioningRequestConfig.model_validate(
                self.cache.configs[ac.spec.parameters.name]
            )
        except ValueError as exc:
            return Inactive(
                f"ProvisioningRequestConfig {ac.spec.parameters.name} is invalid: {exc}")

    async def reconcile_one(self, wl: Workload, check: str) -> float | None:
        state = wl.check(check)
        if state is None:
            return None
        prc = self.prc_for(check)
        if isinstance(prc, Inactive):
            await self.write_state(wl, AdmissionCheckState(
                name=check, state=PENDING, message=f"the check is not active: {prc.message}"))
            return None
        attempt = (state.retry_count or 0) + 1
        name = request_name(wl.metadata.name, check, attempt)
        ns = wl.metadata.namespace or "default"
        owned = [r for r in self.owned_requests(wl)
                 if attempt_of(r.name, wl.metadata.name, check) is not None]
        current = self.cache.requests.get(f"{ns}/{name}")
        if state.state == READY:
            # Kueue's rule: a Ready check's request is never re-created and its updates never
            # recomputed, but its conditions still count: revoked capacity rejects (even
            # after admission) and a booking that expires before admission retries.
            if current is not None:
                v = self._verdict(wl, current, attempt, state.retry_count or 0, prc)
                if v.state in (RETRY, REJECTED):
                    await self.write_state(wl, AdmissionCheckState(
                        name=check, state=v.state, message=v.message,
                        requeueAfterSeconds=v.requeue_after_seconds))
            return None
        if state.state != PENDING:
            return None  # Retry / Rejected: Kueue evicts or deactivates; nothing to do until reset
        if await self._drop_stale(owned, name):
            return None  # the current request was stale: its DELETED event requeues us
        if current is not None and (
            current.deleting or workload_of(current.body)[1] != wl.metadata.uid
        ):
            # The same name from before an eviction (still releasing its nodes) or from an
            # earlier Workload of the same name (awaiting garbage collection): its
            # conditions describe another booking. Its DELETED event requeues us.
            return None
        if current is None:
            return await self.create_request(wl, check, name, prc)
        v = self._verdict(wl, current, attempt, state.retry_count or 0, prc)
        updates: list[PodSetUpdate] = []
        if v.ready:
            try:
                updates = self.ready_updates(wl, current, prc)
            except MergeConflict as exc:
                v = CheckVerdict(REJECTED, f"podSetUpdates conflict: {exc}")
        await self.write_state(wl, AdmissionCheckState(
            name=check, state=v.state, message=v.message,
            requeueAfterSeconds=v.requeue_after_seconds, podSetUpdates=updates,
        ))
        return None

    async def _drop_stale(self, owned: Sequence[RequestRecord], name: str) -> bool:
        """Delete the Workload's requests of earlier attempts, and any without the
        ``muster.dev/pod-sets`` record (made by an earlier Muster, they cannot be mapped
        back to the Workload's pod sets, so they are made anew); True when ``name`` went."""
        stale = [r for r in owned if r.name != name or not r.template_pod_sets]
        if stale:
            await self.delete_requests(stale)
        return any(r.name == name for r in stale)

    def _verdict(
        self, wl: Workload, request: RequestRecord, attempt: int, retry_count: int,
        prc: ProvisioningRequestConfig | None,
    ) -> CheckVerdict:
        cfg = self.config
        limit, base, maximum = (
            (prc.spec.retry_strategy.backoff_limit_count,
             prc.spec.retry_strategy.backoff_base_seconds,
             prc.spec.retry_strategy.backoff_max_seconds)
            if prc is not None
            else (cfg.backoff_limit_count, cfg.backoff_base_seconds, cfg.backoff_max_seconds)
        )
        return verdict(
            request.conditions,
            attempt=attempt, retry_count=retry_count, backoff_limit=limit,
            backoff_base=base, backoff_max=maximum, admitted=wl.condition_true("Admitted"),
            active=wl.is_active, finished=wl.condition_true("Finished"),
            reject_at_once=PERMANENT_FAILURES,
            placed_by_kueue=_placed_by_kueue(wl, request, cfg.check_capacity_class),
        )

    # ------------------------------------------------------------------ creating requests

    def draft_for(
        self, wl: Workload, name: str, prc: ProvisioningRequestConfig | None
    ) -> RequestDraft:
        flavors = {}
        for fname, body in self.cache.flavors.items():
            try:
                flavors[fname] = ResourceFlavor.model_validate(body)
            except ValueError:
                continue
        parameters = dict(prc.spec.parameters) if prc is not None else {}
        prefix = "provreq.kueue.x-k8s.io/"
        for k, v in wl.metadata.annotations.items():
            if k.startswith(prefix):
                parameters[k[len(prefix):]] = v
        return draft_request(
            wl, name, flavors=flavors,
            class_name=prc.spec.provisioning_class_name if prc else self.config.provisioning_class,
            check_capacity_class=self.config.check_capacity_class,
            parameters=parameters,
            managed_resources=prc.spec.managed_resources if prc else (),
            pools=self.cache.facts.pools(), tolerate_pool_taints=self.config.tolerate_pool_taints,
        )

    async def create_request(
        self, wl: Workload, check: str, name: str, prc: ProvisioningRequestConfig | None
    ) -> float | None:
        """Templates (owned by the Workload), then the request (owned by the templates);
        a delay when a stale template of the same name must go first."""
        ns = wl.metadata.namespace or "default"
        try:
            draft = self.draft_for(wl, name, prc)
        except DraftError as exc:
            await self.write_state(wl, AdmissionCheckState(
                name=check, state=REJECTED, message=f"cannot build the request: {exc}"))
            return None
        if not draft.needed:
            await self.write_state(wl, AdmissionCheckState(
                name=check, state=READY, message="the provisioning request is not needed"))
            return None
        wl_body = self.cache.workloads.get(f"{ns}/{wl.metadata.name}")
        if wl_body is None:
            return None  # deleted meanwhile: nothing to provision for
        wl_owner = owner_reference(wl_body)
        # Templates first: Muster's request reconciler fails a request whose templates are
        # missing, so they must exist before the request does.
        template_owners = []
        for ps in draft.pod_sets:
            try:
                tpl: Body | None = await self.kube.create(
                    POD_TEMPLATES, pod_template_body(ps.template_name, ns, ps.template, wl_owner),
                    namespace=ns,
                )
            except ApiError as exc:
                if not exc.conflict:
                    raise
                tpl = await self.kube.get_or_none(POD_TEMPLATES, ps.template_name, namespace=ns)
            if tpl is None or (tpl.get("metadata") or {}).get("deletionTimestamp") or not any(
                o.get("uid") == wl.metadata.uid
                for o in (tpl.get("metadata") or {}).get("ownerReferences") or []
            ):
                # An earlier Workload's template of the same name, awaiting collection:
                # the request must not hang on it. Try again shortly.
                return TEMPLATE_WAIT_SECONDS
            template_owners.append(owner_reference(tpl))
        try:
            created = await self.kube.create(
                PROVISIONING_REQUESTS,
                request_body(name, ns, draft, template_owners, check, wl_body),
                namespace=ns,
            )
        except ApiError as exc:
            if not exc.conflict:
                await self.write_state(wl, AdmissionCheckState(
                    name=check, state=PENDING,
                    message=f"failed to create ProvisioningRequest {name}: {exc.reason}"))
                raise
            return None
        self.cache.requests[f"{ns}/{name}"] = RequestRecord.parse(created)
        self.event(wl, "Normal", "ProvisioningRequestCreated",
                   f"Created ProvisioningRequest {name} ({draft.class_name})")
        await self.write_state(wl, AdmissionCheckState(
            name=check, state=PENDING,
            message=f"ProvisioningRequest {name} created ({draft.class_name})"))
        return None

    # ------------------------------------------------------------------ Ready

    def ready_updates(
        self, wl: Workload, request: RequestRecord, prc: ProvisioningRequestConfig | None
    ) -> list[PodSetUpdate]:
        # Each template's Workload pod set as recorded when the request was created
        # (muster.dev/pod-sets); the request reconciler names its own pod sets, and keys
        # their details, by pod_set_name of the template.
        fit_names: dict[str, list[str]] = {}
        for tname in request.template_names:
            pod_set = request.template_pod_sets.get(tname)
            if pod_set is not None:
                fit_names.setdefault(pod_set, []).append(pod_set_name(tname, request.name))
        targets = [
            self._target(wl, request, wps, fit_names[wps.name], prc)
            for wps in wl.spec.pod_sets if wps.name in fit_names
        ]
        order = list(fit_names)
        targets.sort(key=lambda t: order.index(t.name))
        return pod_set_updates(targets, request.class_name)

    def _target(
        self, wl: Workload, request: RequestRecord, wps: PodSet, fit_names: Sequence[str],
        prc: ProvisioningRequestConfig | None,
    ) -> PodSetTarget:
        """What the Ready check sets on Workload pod set ``wps``, whose pods the request
        booked as its pod sets ``fit_names``."""
        details = request.class_details
        assignments = {a.name: a for a in (wl.status.admission.pod_set_assignments
                                           if wl.status.admission else [])}
        tspec = (wps.template.get("spec") or {})
        existing_selector = dict(tspec.get("nodeSelector") or {})
        existing_tols = [dict(t) for t in tspec.get("tolerations") or []]
        a = assignments.get(wps.name)
        for fname in set((a.flavors if a else {}).values()):
            fspec = ((self.cache.flavors.get(fname) or {}).get("spec") or {})
            existing_selector.update(fspec.get("nodeLabels") or {})
            existing_tols.extend(dict(t) for t in fspec.get("tolerations") or [])
        selector: dict[str, str] = {}
        pinned = a is not None and a.topology_assignment is not None and bool(
            a.topology_assignment.slices)
        if not pinned:
            # Not pinned: the pod set is one template, and one pod set of the request.
            selector.update(parse_domain_detail(details.get(
                f"{PODSET_DETAIL_PREFIX}{fit_names[0]}", "")))
        if prc is not None:
            for entry in prc.spec.pod_set_updates.node_selector:
                value = details.get(entry.value_from_provisioning_class_detail)
                if value is not None:
                    selector[entry.key] = value
        tolerations: list[dict[str, Any]] = []
        if self.config.tolerate_pool_taints and request.booking is not None:
            pools_by_name = {p.name: p for p in self.cache.facts.pools()}
            for pool_name in _pools_used(request.booking, fit_names, self.cache.facts.pool_of):
                pool = pools_by_name.get(pool_name)
                if pool is None:
                    continue
                tolerations.extend(taint_tolerations(
                    t for t in pool.taints if not tolerates(existing_tols, t)))
        return PodSetTarget(
            name=wps.name, request=request.name, node_selector=selector,
            tolerations=_dedupe(tolerations), existing_selector=existing_selector,
            existing_annotations=(wps.template.get("metadata") or {}).get("annotations") or {},
            existing_tolerations=existing_tols,
        )

    # ------------------------------------------------------------------ writes

    def event(self, wl: Workload, type_: EventType, reason: str, text: str) -> None:
        """A core/v1 Event on the Workload (``kubectl describe workload``), queued: the
        recorder posts it in the background, so it never delays or fails a reconcile."""
        self.events.event(
            ObjectReference(
                api_version=wl.api_version, kind="Workload", name=wl.metadata.name,
                namespace=wl.metadata.namespace or "default", uid=wl.metadata.uid,
                resource_version=wl.metadata.resource_version,
            ),
            type_, reason, text,
        )

    async def write_state(self, wl: Workload, new: AdmissionCheckState) -> None:
        """Read-modify-write of ``status.admissionChecks`` under the Workload's
        resourceVersion; on 409 re-read and redo, so another controller's concurrent write
        to its own entry survives."""
        ns = wl.metadata.namespace or "default"
        key = f"{ns}/{wl.metadata.name}"
        body: Body | None = self.cache.workloads.get(key)
        for _ in range(CONFLICT_RETRIES):
            if body is None:
                return
            states = list((body.get("status") or {}).get("admissionChecks") or [])
            entry = next((s for s in states if s.get("name") == new.name), None)
            if same_state(entry, new):
                return
            patch = {
                "metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                "status": {"admissionChecks": set_check_state(
                    states, new, now=rfc3339(self.clock.now()))},
            }
            try:
                updated = await self.kube.merge_patch(
                    WORKLOADS, wl.metadata.name, patch, namespace=ns, subresource="status"
                )
            except ApiError as exc:
                if exc.not_found:
                    return
                if not exc.conflict:
                    raise
                body = await self.kube.get_or_none(WORKLOADS, wl.metadata.name, namespace=ns)
                continue
            self.cache.workloads[key] = updated
            self.written[key] = str(updated["metadata"].get("resourceVersion"))
            log.info("Workload %s: check %s is %s: %s", key, new.name, new.state, new.message)
            if entry is None or entry.get("state") != new.state:
                self.event(
                    wl, "Warning" if new.state == REJECTED else "Normal",
                    "AdmissionCheckUpdated", f"Admission check {new.name} is {new.state}: "
                    f"{new.message}",
                )
            return
        raise ApiError(409, "Conflict", f"Workload {key}: gave up after {CONFLICT_RETRIES} "
                       "conflicting writes")


def _pools_used(
    booking: Booking, fit_names: Collection[str], pool_of: Callable[[str], str | None]
) -> list[str]:
    """Pools whose nodes (new or existing) the booking puts pods of the request's pod sets
    ``fit_names`` on."""
    pools: list[str] = []
    for a in booking.plan.assignments:
        if a.pod_set not in fit_names:
            continue
        pool = a.new_node.pool if a.new_node is not None else (
            pool_of(a.node) if a.node else None)
        if pool and pool not in pools:
            pools.append(pool)
    return pools


def _dedupe(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def _placed_by_kueue(wl: Workload, request: RequestRecord, check_capacity_class: str) -> bool:
    """The request books nodes Kueue TAS chose: Muster drafts a Workload with a
    ``topologyAssignment`` into a check-capacity request only when every pod set it books
    is pinned that way."""
    assignments = wl.status.admission.pod_set_assignments if wl.status.admission else []
    return request.class_name == check_capacity_class and any(
        a.topology_assignment is not None and a.topology_assignment.slices
        for a in assignments)


__all__ = ["POOL_LABEL", "CheckReconciler", "KueueCache"]

