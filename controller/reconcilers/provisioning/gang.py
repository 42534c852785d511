"""The request as the fit engine sees it (:func:`build_gang`), and :class:`Invalid`, what is
wrong with it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from controller.api.parameters import read_parameters
from controller.api.provisioningrequest import ProvisioningRequest
from controller.common.conditions import Reason
from controller.config import MusterConfig
from controller.fit.types import GangRequest, Mode
from controller.inputs.constraints import needs_running_pods
from controller.inputs.relaxation import relax_after
from controller.inputs.snapshot import InvalidTemplate, SnapshotError, gang_of, parse_object
from controller.state.cache import ClusterState
from controller.state.object_store import TemplateError
from controller.state.requests import RequestRecord
from controller.state.tenancy import foreign_request_owner


@dataclass(frozen=True, slots=True)
class Invalid(Exception):
    reason: Reason
    detail: str
    missing: tuple[str, ...] = ()
    """What the request refers to and the cache does not hold (``PodTemplate ns/t``,
    ``ResourceClaimTemplate ns/c``, ``DeviceClass gpu``): each comes through its own watch
    and may only be late, so the request waits for it (``retry.arrival_wait_seconds``)."""


def build_gang(req: RequestRecord, state: ClusterState, config: MusterConfig) -> GangRequest:
    """The request as the fit engine sees it, from ``state``'s templates, DRA objects and
    running pods (the controller's reconcile and ``kubectl muster fit`` alike);
    :class:`Invalid` names what is wrong."""
    mode = config.classes.mode_for(req.class_name, req.parameters) or Mode.PROVISION
    params = read_parameters(req.parameters, mode, req.class_name)
    if params.problems:
        raise Invalid(Reason.INVALID_PARAMETERS, "; ".join(params.problems))
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
        found = state.objects.template(req.namespace, ref)
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
                       state.objects.bound_pods(every=every))
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
    run = params.values.max_run_duration_seconds
    return gang if run is None else replace(gang, run_seconds=float(run))


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
