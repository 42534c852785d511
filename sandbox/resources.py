"""The resource types the sandbox serves: built-in core/v1, coordination and apiextensions
types, plus any type registered from a CustomResourceDefinition.

A :class:`ResourceType` is identified by ``(group, plural)``; every served version of a CRD
shares one storage table (the sandbox does no conversion, it only rewrites ``apiVersion``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sandbox.errors import ApiError, bad_request

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    """One served resource (e.g. ``pods`` or ``provisioningrequests.autoscaling.x-k8s.io``)."""

    group: str
    versions: tuple[str, ...]
    plural: str
    singular: str
    kind: str
    namespaced: bool
    status_subresource: bool = False
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    extra_subresources: tuple[str, ...] = ()
    # Per-version openAPIV3Schema (CRDs only), used for listType=map merging in server-side apply.
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False, hash=False)
    # Per-version additionalPrinterColumns (CRDs only), for kubectl's Table output.
    printer_columns: dict[str, list[dict[str, Any]]] = field(
        default_factory=dict, compare=False, hash=False)
    # Per-version deprecation warnings (CRDs only).
    deprecations: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    builtin: bool = True

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def storage_version(self) -> str:
        return self.versions[0]

    def api_version(self, version: str | None = None) -> str:
        version = version or self.storage_version
        return f"{self.group}/{version}" if self.group else version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def schema_for(self, version: str | None) -> dict[str, Any] | None:
        return self.schemas.get(version or self.storage_version)


def _core(
    plural: str, kind: str, namespaced: bool, *, status: bool = False,
    short: tuple[str, ...] = (), extra: tuple[str, ...] = (),
) -> ResourceType:
    return ResourceType(
        group="", versions=("v1",), plural=plural, singular=kind.lower(), kind=kind,
        namespaced=namespaced, status_subresource=status, short_names=short,
        extra_subresources=extra,
    )


CRD_GROUP = "apiextensions.k8s.io"

BUILTIN_TYPES: tuple[ResourceType, ...] = (
    _core("namespaces", "Namespace", False, status=True, short=("ns",)),
    _core("nodes", "Node", False, status=True, short=("no",)),
    _core("pods", "Pod", True, status=True, short=("po",), extra=("binding",)),
    _core("podtemplates", "PodTemplate", True),
    _core("events", "Event", True, short=("ev",)),
    _core("configmaps", "ConfigMap", True, short=("cm",)),
    _core("secrets", "Secret", True),
    _core("services", "Service", True, status=True, short=("svc",)),
    _core("serviceaccounts", "ServiceAccount", True, short=("sa",)),
    ResourceType(
        group="coordination.k8s.io", versions=("v1",), plural="leases", singular="lease",
        kind="Lease", namespaced=True,
    ),
    # Dynamic Resource Allocation (resource.k8s.io/v1), for the DRA-aware fit tests.
    ResourceType(group="resource.k8s.io", versions=("v1",), plural="deviceclasses",
                 singular="deviceclass", kind="DeviceClass", namespaced=False),
    ResourceType(group="resource.k8s.io", versions=("v1",), plural="resourceslices",
                 singular="resourceslice", kind="ResourceSlice", namespaced=False),
    ResourceType(group="resource.k8s.io", versions=("v1",), plural="resourceclaims",
                 singular="resourceclaim", kind="ResourceClaim", namespaced=True,
                 status_subresource=True),
    ResourceType(group="resource.k8s.io", versions=("v1",), plural="resourceclaimtemplates",
                 singular="resourceclaimtemplate", kind="ResourceClaimTemplate",
                 namespaced=True),
    ResourceType(
        group=CRD_GROUP, versions=("v1",), plural="customresourcedefinitions",
        singular="customresourcedefinition", kind="CustomResourceDefinition",
        namespaced=False, status_subresource=True, short_names=("crd", "crds"),
        categories=("api-extensions",),
    ),
)


def _deprecations(group: str, kind: str, entries: list[Any]) -> dict[str, str]:
    out = {}
    for v in entries:
        if isinstance(v, dict) and v.get("deprecated") and v.get("name"):
            out[v["name"]] = str(v.get("deprecationWarning")
                                 or f"{group}/{v['name']} {kind} is deprecated")
    return out


def _crd_versions(entries: list[Any]) -> tuple[
    list[str], str | None, bool, dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]],
]:
    """(served versions, storage version, has status subresource, schemas, printer columns)."""
    versions: list[str] = []
    storage: str | None = None
    status = False
    schemas: dict[str, dict[str, Any]] = {}
    printers: dict[str, list[dict[str, Any]]] = {}
    for v in entries:
        if not isinstance(v, dict) or not v.get("name"):
            raise bad_request("CustomResourceDefinition version entries need a name")
        if v.get("served", True):
            versions.append(v["name"])
        if v.get("storage"):
            storage = v["name"]
        if "status" in (v.get("subresources") or {}):
            status = True
        schema = (v.get("schema") or {}).get("openAPIV3Schema")
        if isinstance(schema, dict):
            schemas[v["name"]] = schema
        columns = v.get("additionalPrinterColumns")
        if isinstance(columns, list):
            printers[v["name"]] = [c for c in columns if isinstance(c, dict)]
    return versions, storage, status, schemas, printers


def types_from_crd(crd: dict[str, Any]) -> ResourceType:
    """Build the served resource type of a CustomResourceDefinition object (apiextensions/v1)."""
    spec = crd.get("spec")
    if not isinstance(spec, dict):
        raise bad_request("CustomResourceDefinition has no spec")
    group = spec.get("group")
    names = spec.get("names") or {}
    plural = names.get("plural")
    kind = names.get("kind")
    if not group or not plural or not kind:
        raise ApiError(
            422, "Invalid",
            "CustomResourceDefinition needs spec.group, spec.names.plural and spec.names.kind",
        )
    expected = f"{plural}.{group}"
    name = (crd.get("metadata") or {}).get("name")
    if name != expected:
        raise ApiError(
            422, "Invalid",
            f'CustomResourceDefinition.apiextensions.k8s.io "{name}" is invalid: '
            f'metadata.name: Invalid value: "{name}": must be spec.names.plural+"."+spec.group',
        )
    versions, storage, status, schemas, printers = _crd_versions(spec.get("versions") or [])
    if not versions:
        raise ApiError(422, "Invalid", f"CustomResourceDefinition {name} serves no version")
    # Storage (or first served) version first: that is the preferred version in discovery.
    if storage in versions:
        versions.remove(storage)
        versions.insert(0, storage)
    scope = spec.get("scope", "Namespaced")
    return ResourceType(
        group=group, versions=tuple(versions), plural=plural,
        singular=names.get("singular") or kind.lower(), kind=kind,
        namespaced=scope == "Namespaced", status_subresource=status,
        short_names=tuple(names.get("shortNames") or ()),
        categories=tuple(names.get("categories") or ()),
        schemas=schemas, printer_columns=printers, builtin=False,
        deprecations=_deprecations(group, kind, spec.get("versions") or []),
    )


class Registry:
    """Lookup of served resource types by group/version/plural, kind or short name."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], ResourceType] = {}
        for rt in BUILTIN_TYPES:
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self._by_key[rt.key] = rt

    def remove(self, key: tuple[str, str]) -> None:
        self._by_key.pop(key, None)

    def all(self) -> list[ResourceType]:
        return list(self._by_key.values())

    def get(self, group: str, plural: str) -> ResourceType | None:
        return self._by_key.get((group, plural))

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        rt = self._by_key.get((group, plural))
        if rt is None or version not in rt.versions:
            return None
        return rt

    def resolve(self, name: str) -> ResourceType:
        """Resolve ``pods``, ``Pod``, ``po``, ``plural.group`` or ``Kind.group`` to one type."""
        if (rt := self._by_key.get(("", name))) is not None:
            return rt
        plural, _, group = name.partition(".")
        if group and (rt := self._by_key.get((group, plural))) is not None:
            return rt
        matches = [
            rt for rt in self._by_key.values()
            if (not group or rt.group == group)
            and (
                plural in (rt.plural, rt.singular) or plural in rt.short_names
                or plural == rt.kind
            )
        ]
        # Core types win over CRDs that reuse a name, like kubectl's resolution.
        core = [rt for rt in matches if rt.group == ""]
        if core:
            return core[0]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise ApiError(404, "NotFound", f"the server doesn't have a resource type {name!r}")
        raise ApiError(
            400, "BadRequest",
            f"resource name {name!r} is ambiguous: "
            + ", ".join(sorted(rt.qualified for rt in matches)),
        )

    def for_api_version(self, api_version: str, kind: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        for rt in self._by_key.values():
            if rt.group == group and rt.kind == kind and version in rt.versions:
                return rt
        raise ApiError(
            404, "NotFound", f"no resource of kind {kind!r} is served in {api_version!r}",
        )
