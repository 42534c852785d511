"""The API server's rules for the parts of a PodTemplate that decide placement, so Muster
plans only from objects the API server would accept, also where it builds or reads them
itself (``muster fit`` files, Kueue path B). Pure; each problem names its field.

:func:`pod_template_problems` covers what the models cannot check field by field: resource
names and quantities (extended resources and hugepages need limits equal to requests and
whole numbers; requests within limits), claims a container uses but the pod does not declare,
label keys and values of selectors, tolerations, topology spread. :func:`unknown_fields`
is strict field validation (a misspelt field is an error, not dropped) for the pod spec and
its containers, used on objects read from files.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from controller.api.pod import Container, LabelSelector, PodSpec, PodTemplate
from controller.api.quantity import parse_quantity, to_resources

_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = re.compile(rf"({_NAME})?")
_NAME_PART = re.compile(_NAME)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NATIVE = frozenset({"cpu", "memory", "ephemeral-storage"})

POD_SPEC_FIELDS = frozenset({
    "volumes", "initContainers", "containers", "ephemeralContainers", "restartPolicy",
    "terminationGracePeriodSeconds", "activeDeadlineSeconds", "dnsPolicy", "nodeSelector",
    "serviceAccountName", "serviceAccount", "automountServiceAccountToken", "nodeName",
    "hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace", "securityContext",
    "imagePullSecrets", "hostname", "subdomain", "affinity", "schedulerName", "tolerations",
    "hostAliases", "priorityClassName", "priority", "dnsConfig", "readinessGates",
    "runtimeClassName", "enableServiceLinks", "preemptionPolicy", "overhead",
    "topologySpreadConstraints", "setHostnameAsFQDN", "os", "hostUsers", "schedulingGates",
    "resourceClaims", "resources", "hostnameOverride", "workloadRef", "schedulingGroup",
})
"""core/v1 PodSpec fields (the release Muster targets; see docs/design/filter-parity.md)."""
CONTAINER_FIELDS = frozenset({
    "name", "image", "command", "args", "workingDir", "ports", "envFrom", "env", "resources",
    "resizePolicy", "restartPolicy", "restartPolicyRules", "volumeMounts", "volumeDevices",
    "livenessProbe", "readinessProbe", "startupProbe", "lifecycle", "terminationMessagePath",
    "terminationMessagePolicy", "imagePullPolicy", "securityContext", "stdin", "stdinOnce",
    "tty",
})
RESOURCE_FIELDS = frozenset({"requests", "limits", "claims"})

OBJECT_NAME_MAX = 253
_HASH_LEN = 5
_PREFIX_MAX = OBJECT_NAME_MAX - _HASH_LEN - 1  # 247, as Kueue's limitObjectName


def limit_object_name(full: str) -> str:
    """Kueue's ``limitObjectName``: names over 247 characters keep their first 247
    characters plus ``-`` and the first 5 hex digits of the full name's sha1."""
    if len(full) <= _PREFIX_MAX:
        return full
    digest = hashlib.sha1(full.encode()).hexdigest()[:_HASH_LEN]  # naming, not security
    return f"{full[:_PREFIX_MAX]}-{digest}"



def qualified_name(key: str) -> bool:
    """A label key (``[prefix/]name``), as ``IsQualifiedName``: at most one ``/``, and a
    prefix, when there is a ``/``, that is a non-empty DNS subdomain ("/rack" is refused)."""
    parts = key.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix or len(prefix) > 253 or _DNS_SUBDOMAIN.fullmatch(prefix) is None:
            return False
    name = parts[-1]
    return 0 < len(name) <= 63 and _NAME_PART.fullmatch(name) is not None


def label_value(value: str) -> bool:
    return len(value) <= 63 and _LABEL_VALUE.fullmatch(value) is not None


def _labels(where: str, labels: Mapping[str, str]) -> list[str]:
    out = []
    for key, value in labels.items():
        if not qualified_name(key):
            out.append(f"{where}: invalid label key {key!r}")
        if not label_value(value):
            out.append(f"{where}: invalid label value {value!r} for {key}")
    return out


def _selector(where: str, selector: LabelSelector | None) -> list[str]:
    if selector is None:
        return []
    out = _labels(f"{where}.matchLabels", selector.match_labels)
    for i, req in enumerate(selector.match_expressions):
        if not qualified_name(req.key):
            out.append(f"{where}.matchExpressions[{i}].key: invalid label key {req.key!r}")
        out.extend(f"{where}.matchExpressions[{i}].values: invalid label value {v!r}"
                   for v in req.values if not label_value(v))
    return out


def not_overcommitable(name: str) -> bool:
    """Not overcommitable: extended resources (a domain other than kubernetes.io) and
    hugepages need requests equal to limits, in whole numbers for extended ones."""
    if name.startswith("hugepages-"):
        return True
    prefix = name.rpartition("/")[0]
    return bool(prefix) and not (prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"))


def _resource_name(name: str) -> bool:
    if name in NATIVE or name.startswith("hugepages-"):
        return True
    return "/" in name and qualified_name(name)


def _resources(where: str, requests: Mapping[str, str], limits: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    values: dict[str, dict[str, Decimal]] = {"requests": {}, "limits": {}}
    for kind, given in (("requests", requests), ("limits", limits)):
        for name, text in given.items():
            if not _resource_name(name):
                out.append(f"{where}.{kind}[{name}]: invalid resource name")
            quantity = parse_quantity(text)
            if quantity < 0:
                out.append(f"{where}.{kind}[{name}]: must be greater than or equal to 0")
            values[kind][name] = quantity
    req, lim = values["requests"], values["limits"]
    for name in sorted(set(req) | set(lim)):
        if not_overcommitable(name):
            if name not in lim:
                out.append(f"{where}.limits[{name}]: must be set for {name} (not "
                           "overcommitable: requests must equal limits)")
            elif name in req and req[name] != lim[name]:
                out.append(f"{where}.requests[{name}]: must be equal to the limit "
                           f"({requests[name]} != {limits[name]})")
            if not name.startswith("hugepages-") and any(
                v != v.to_integral_value() for v in (req.get(name), lim.get(name))
                if v is not None
            ):
                out.append(f"{where}.requests[{name}]: must be an integer")
        elif name in req and name in lim and req[name] > lim[name]:
            out.append(f"{where}.requests[{name}]: must be less than or equal to the limit "
                       f"({requests[name]} > {limits[name]})")
    return out


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _container(where: str, c: Container, declared: set[str]) -> list[str]:
    res = c.resources
    out = []
    if c.name and (len(c.name) > 63 or _DNS_LABEL.fullmatch(c.name) is None):
        # Not about placement, but the API server refuses the pods: a plan for them would
        # buy nodes nothing can use.
        out.append(f"{where}.name: {c.name!r} must be a lowercase RFC 1123 label (a-z, 0-9, "
                   "'-', at most 63 characters)")
    out += _resources(f"{where}.resources", res.requests, res.limits)
    for i, claim in enumerate((res.model_extra or {}).get("claims") or []):
        name = claim.get("name") if isinstance(claim, Mapping) else None
        if name not in declared:
            out.append(f"{where}.resources.claims[{i}].name: {name!r} is not one of the "
                       "pod's spec.resourceClaims")
    return out


def pod_spec_problems(spec: PodSpec, where: str = "spec") -> list[str]:
    declared = {ref.name for ref in spec.resource_claims}
    out = _claims(spec, where)
    names: set[str] = set()
    for kind, containers in (("containers", spec.containers),
                             ("initContainers", spec.init_containers)):
        for i, c in enumerate(containers):
            # One name space for both lists, as the API server's validateContainers. (A
            # missing name is let through: hand-written inputs of `muster fit` omit it.)
            if c.name and c.name in names:
                out.append(f"{where}.{kind}[{i}].name: Duplicate value {c.name!r}")
            names.add(c.name)
            out.extend(_container(f"{where}.{kind}[{i}]", c, declared))
    if spec.resources is not None:
        out.extend(_resources(f"{where}.resources", spec.resources.requests,
                              spec.resources.limits))
        out.extend(_pod_level(spec, where))
    return [*out, *_node_selection(spec, where), *_tolerations(spec, where),
            *_pod_affinity(spec, where), *_spread(spec, where)]


def _pod_level(spec: PodSpec, where: str) -> list[str]:
    """Pod-level requests hold at least what the containers ask together (the API server's
    ``validatePodResourceConsistency``; found by the scheduler oracle)."""
    if spec.resources is None:
        return []
    try:
        containers = spec.container_requests()
        given = to_resources(spec.resources.requests)
    except ValueError:
        return []  # a bad quantity, reported with its field already
    return [f"{where}.resources.requests[{name}]: {spec.resources.requests[name]} must be "
            f"greater than or equal to the containers' aggregate requests ({_amount(name, total)})"
            for name, total in sorted(containers.items())
            if name in given and given[name] < total]


def _amount(name: str, value: int) -> str:
    return f"{value}m" if name == "cpu" else str(value)


def _claims(spec: PodSpec, where: str) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for i, ref in enumerate(spec.resource_claims):
        if ref.name in seen:
            out.append(f"{where}.resourceClaims[{i}].name: duplicate {ref.name!r}")
        seen.add(ref.name)
        if bool(ref.resource_claim_name) == bool(ref.resource_claim_template_name):
            out.append(f"{where}.resourceClaims[{i}]: exactly one of resourceClaimName and "
                       "resourceClaimTemplateName must be set")
    return out


def _node_selection(spec: PodSpec, where: str) -> list[str]:
    out = _labels(f"{where}.nodeSelector", spec.node_selector)
    for i, term in enumerate(spec.required_terms()):
        for j, req in enumerate(term.match_expressions):
            at = (f"{where}.affinity.nodeAffinity.required.nodeSelectorTerms[{i}]"
                  f".matchExpressions[{j}]")
            if not qualified_name(req.key):
                out.append(f"{at}.key: invalid label key {req.key!r}")
            if req.operator in ("In", "NotIn"):
                out.extend(f"{at}.values: invalid label value {v!r}"
                           for v in req.values if not label_value(v))
    return out


def _tolerations(spec: PodSpec, where: str) -> list[str]:
    out = []
    for i, tol in enumerate(spec.tolerations):
        if tol.key and not qualified_name(tol.key):
            out.append(f"{where}.tolerations[{i}].key: invalid key {tol.key!r}")
        if tol.value and not label_value(tol.value):
            out.append(f"{where}.tolerations[{i}].value: invalid value {tol.value!r}")
        if tol.toleration_seconds is not None and tol.effect not in ("", "NoExecute"):
            out.append(f"{where}.tolerations[{i}].effect: must be NoExecute when "
                       "tolerationSeconds is set")
    return out


def _pod_affinity(spec: PodSpec, where: str) -> list[str]:
    out: list[str] = []
    aff = spec.affinity
    for kind, group in (("podAffinity", aff.pod_affinity if aff else None),
                        ("podAntiAffinity", aff.pod_anti_affinity if aff else None)):
        for i, term in enumerate(group.required if group else []):
            at = f"{where}.affinity.{kind}.required[{i}]"
            out.extend(_selector(f"{at}.labelSelector", term.label_selector))
            out.extend(_selector(f"{at}.namespaceSelector", term.namespace_selector))
            if not qualified_name(term.topology_key):
                out.append(f"{at}.topologyKey: invalid key {term.topology_key!r}")
    return out


def _spread(spec: PodSpec, where: str) -> list[str]:
    out: list[str] = []
    seen: set[tuple[str, str]] = set()
    for i, tsc in enumerate(spec.topology_spread_constraints):
        at = f"{where}.topologySpreadConstraints[{i}]"
        pair = (tsc.topology_key, tsc.when_unsatisfiable)
        if pair in seen:
            out.append(f"{at}: duplicate topologyKey {pair[0]} with whenUnsatisfiable {pair[1]}")
        seen.add(pair)
        if not qualified_name(tsc.topology_key):
            out.append(f"{at}.topologyKey: invalid key {tsc.topology_key!r}")
        out.extend(_selector(f"{at}.labelSelector", tsc.label_selector))
        sel = tsc.label_selector
        keys = ({*sel.match_labels, *(r.key for r in sel.match_expressions)}
                if sel is not None else set())
        out.extend(f"{at}.matchLabelKeys: {k} is also in labelSelector"
                   for k in tsc.match_label_keys if k in keys)
    return out


def pod_template_problems(template: PodTemplate) -> list[str]:
    """Everything the API server would refuse in ``template`` that the models let through."""
    meta = template.template.metadata
    return [*_labels("template.metadata.labels", meta.labels),
            *pod_spec_problems(template.template.spec, "template.spec")]


def unknown_fields(doc: Mapping[str, Any]) -> list[str]:
    """Strict field validation of a PodTemplate document's pod spec and containers."""
    spec = ((doc.get("template") or {}).get("spec")) or {}
    if not isinstance(spec, Mapping):
        return []
    out = [f"template.spec.{k}: unknown field" for k in _unknown(spec, POD_SPEC_FIELDS)]
    for kind in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(kind) or []):
            if not isinstance(c, Mapping):
                continue
            out.extend(f"template.spec.{kind}[{i}].{k}: unknown field"
                       for k in _unknown(c, CONTAINER_FIELDS))
            res = c.get("resources")
            if isinstance(res, Mapping):
                out.extend(f"template.spec.{kind}[{i}].resources.{k}: unknown field"
                           for k in _unknown(res, RESOURCE_FIELDS))
    return out


REQUEST_SPEC_FIELDS = frozenset({"podSets", "provisioningClassName", "parameters"})
POD_SET_FIELDS = frozenset({"podTemplateRef", "count"})


def request_unknown_fields(doc: Mapping[str, Any]) -> list[str]:
    """Strict field validation of a ProvisioningRequest document's spec (its CRD schema)."""
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        return []
    out = [f"spec.{k}: unknown field" for k in _unknown(spec, REQUEST_SPEC_FIELDS)]
    for i, ps in enumerate(spec.get("podSets") or []):
        if isinstance(ps, Mapping):
            out.extend(f"spec.podSets[{i}].{k}: unknown field"
                       for k in _unknown(ps, POD_SET_FIELDS))
    return out


def _unknown(obj: Mapping[str, Any], known: Iterable[str]) -> list[str]:
    return sorted(k for k in obj if k not in known)
