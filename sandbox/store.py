"""The sandbox's object store: the semantics of a kube-apiserver over in-memory dicts.

Objects are plain JSON dicts. A stored dict is never mutated: every write builds a new dict, so
readers (serialisers, watch events) can share stored dicts without copying. The in-process API
(`Store.create/get/list/replace/patch/apply/delete/bind/watch`) hands out deep copies.

Cost model (see benchmarks/sandbox_bench.py): a table per resource type keyed by
``(namespace, name)``, a namespace index, a ``spec.nodeName`` index for pods, a uid index and an
owner-uid -> dependents index for garbage collection, and a bounded ring buffer of recent watch
events per table. Single-object reads and writes and watch fan-out do not depend on how many
objects are stored; LIST is O(objects in the namespace).
"""

from __future__ import annotations

import base64
import builtins
import json
import random
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from sandbox import errors, yamlio
from sandbox.errors import ApiError, bad_request, invalid
from sandbox.jsoncopy import copy_obj, jcopy
from sandbox.patch import apply_merge, json_patch, merge_patch, strategic_merge_patch
from sandbox.resources import CRD_GROUP, Registry, ResourceType, types_from_crd
from sandbox.schema import prune
from sandbox.selectors import FieldSelector, LabelSelector, matcher
from sandbox.ssa import field_paths, plan_apply, to_fields_v1
from sandbox.watch import Watcher, WatchEvent

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)

INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
PATCH_TYPES = ("merge", "json", "strategic", "apply")
CONTENT_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+json": "apply",
}
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_TOP_LEVEL_NON_SPEC = frozenset({"metadata", "status", "kind", "apiVersion"})


_clock: list[Any] = [0, ""]


def now_iso() -> str:
    """The current UTC time as RFC 3339 seconds (formatted once per second, writes are hot)."""
    now = time.time()
    second = int(now)
    if _clock[0] != second:
        _clock[0] = second
        _clock[1] = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(_clock[1])


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in _TOP_LEVEL_NON_SPEC}


def _owner_uids(obj: Mapping[str, Any]) -> set[str]:
    refs = _meta(obj).get("ownerReferences") or []
    return {r["uid"] for r in refs if isinstance(r, dict) and r.get("uid")}


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _valid_name(name: str) -> bool:
    return len(name) <= 253 and _DNS_SUBDOMAIN.match(name) is not None


class Table:
    """Storage, indexes, event history and watchers of one resource type."""

    def __init__(self, rt: ResourceType, history: int) -> None:
        self.rt = rt
        self.objects: dict[Key, Obj] = {}
        self.by_ns: dict[str, dict[str, Obj]] = {}
        self.by_node: dict[str, set[Key]] | None = {} if rt.key == ("", "pods") else None
        self.events: deque[WatchEvent] = deque(maxlen=history)
        self.compacted_rv = 0
        self.watchers: set[Watcher] = set()

    def put(self, key: Key, obj: Obj, old: Obj | None) -> None:
        self.objects[key] = obj
        self.by_ns.setdefault(key[0], {})[key[1]] = obj
        if self.by_node is not None:
            old_node = (old or {}).get("spec", {}).get("nodeName") if old else None
            new_node = (obj.get("spec") or {}).get("nodeName")
            if old_node != new_node:
                if old_node:
                    self.by_node.get(old_node, set()).discard(key)
                if new_node:
                    self.by_node.setdefault(new_node, set()).add(key)

    def drop(self, key: Key) -> Obj | None:
        obj = self.objects.pop(key, None)
        if obj is None:
            return None
        ns = self.by_ns.get(key[0])
        if ns is not None:
            ns.pop(key[1], None)
            if not ns:
                del self.by_ns[key[0]]
        if self.by_node is not None:
            node = (obj.get("spec") or {}).get("nodeName")
            if node and node in self.by_node:
                self.by_node[node].discard(key)
                if not self.by_node[node]:
                    del self.by_node[node]
        return obj

    def record(self, ev: WatchEvent) -> None:
        if self.events.maxlen is not None and len(self.events) == self.events.maxlen:
            self.compacted_rv = self.events[0].rv
        self.events.append(ev)
        for w in list(self.watchers):
            w.offer(ev)


class Store:
    """In-memory Kubernetes object store with apiserver semantics (see module docstring)."""

    def __init__(
        self,
        *,
        history: int = 10_000,
        watch_queue: int = 50_000,
        seed: int | None = None,
        prune_unknown_fields: bool = True,
    ) -> None:
        self.registry = Registry()
        self.prune_unknown_fields = prune_unknown_fields
        self.history = history
        self.watch_queue = watch_queue
        self._rng = random.Random(seed)
        self._rv = 0
        self._tables: dict[tuple[str, str], Table] = {}
        self._uids: dict[str, tuple[tuple[str, str], Key]] = {}
        self._dependents: dict[str, set[tuple[tuple[str, str], Key]]] = {}
        self.watch_event_hooks: list[Callable[[ResourceType, WatchEvent], None]] = []
        for rt in self.registry.all():
            self._tables[rt.key] = Table(rt, history)
        for ns in INITIAL_NAMESPACES:
            self.create("namespaces", {"metadata": {"name": ns}})

    # ------------------------------------------------------------------ bookkeeping

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out (store-wide, like etcd's revision)."""
        return self._rv

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _new_uid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def table(self, rt: ResourceType) -> Table:
        table = self._tables.get(rt.key)
        if table is None:
            raise errors.ApiError(404, "NotFound", f"resource {rt.qualified} is not served")
        return table

    def resolve(self, resource: str | ResourceType) -> ResourceType:
        if isinstance(resource, ResourceType):
            return resource
        return self.registry.resolve(resource)

    def _resolve_for_obj(
        self, resource: str | ResourceType, obj: Mapping[str, Any], namespace: str | None,
    ) -> tuple[ResourceType, str | None]:
        """The resource type, and the namespace an object without an explicit one goes to.

        A namespaced object with no ``namespace`` argument lands in its own
        ``metadata.namespace``, else in "default" (what kubectl does).
        """
        rt = self.resolve(resource)
        if rt.namespaced and namespace is None:
            namespace = _meta(obj).get("namespace") or "default"
        return rt, namespace

    def _key(self, rt: ResourceType, name: str, namespace: str | None) -> Key:
        if rt.namespaced:
            if not namespace:
                raise bad_request(f"{rt.qualified} is namespaced: a namespace is required")
            return (namespace, name)
        return ("", name)

    def _emit(self, table: Table, ev: WatchEvent) -> None:
        table.record(ev)
        for hook in self.watch_event_hooks:
            hook(table.rt, ev)

    def count(self, resource: str | ResourceType) -> int:
        return len(self.table(self.resolve(resource)).objects)

    # ------------------------------------------------------------------ reads

    def get_raw(self, rt: ResourceType, name: str, namespace: str | None) -> Obj:
        obj = self.table(rt).objects.get(self._key(rt, name, namespace))
        if obj is None:
            raise errors.not_found(rt.plural, rt.group, name)
        return obj

    def get(self, resource: str | ResourceType, name: str, namespace: str | None = None) -> Obj:
        """A deep copy of one object; ``ApiError(404)`` when absent."""
        rt = self.resolve(resource)
        return copy_obj(self.get_raw(rt, name, namespace or self._default_ns(rt)))

    def _default_ns(self, rt: ResourceType) -> str | None:
        return "default" if rt.namespaced else None

    def list_raw(
        self,
        rt: ResourceType,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        field_selector: FieldSelector | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> tuple[list[Obj], str, str | None]:
        """(items sorted by namespace/name, list resourceVersion, continue token)."""
        table = self.table(rt)
        labels = label_selector or LabelSelector([])
        fields = field_selector or FieldSelector([])
        ns = namespace if rt.namespaced else None
        if ns is None and fields:
            ns = fields.value_for("metadata.namespace") if rt.namespaced else None
        candidates: Iterable[tuple[Key, Obj]]
        name = fields.value_for("metadata.name") if fields else None
        node = fields.value_for("spec.nodeName") if fields else None
        if name is not None and ns is not None:
            key = (ns, name) if rt.namespaced else ("", name)
            obj = table.objects.get(key)
            candidates = [(key, obj)] if obj is not None else []
        elif node is not None and table.by_node is not None:
            keys = table.by_node.get(node, set()) if node else set()
            candidates = [(k, table.objects[k]) for k in keys if ns is None or k[0] == ns]
            if not node:
                candidates = table.objects.items()
        elif ns is not None:
            candidates = (((ns, n), o) for n, o in table.by_ns.get(ns, {}).items())
        else:
            candidates = table.objects.items()
        match = matcher(labels, fields)
        selected = [(k, o) for k, o in candidates if match is None or match(o)]
        selected.sort(key=lambda ko: ko[0])
        list_rv = str(self._rv)
        if continue_token:
            after, list_rv = self._decode_continue(continue_token)
            if list_rv.isdigit() and int(list_rv) < table.compacted_rv:
                # As the API server answers when the listing's snapshot was compacted away.
                raise errors.gone(
                    "The provided continue parameter is too old to display a consistent "
                    "list result. You can start a new list without the continue parameter."
                )
            selected = [(k, o) for k, o in selected if k > after]
        token = None
        if limit and limit > 0 and len(selected) > limit:
            selected = selected[:limit]
            last = selected[-1][0]
            token = base64.urlsafe_b64encode(
                json.dumps({"k": list(last), "rv": list_rv}).encode()
            ).decode()
        return [o for _, o in selected], list_rv, token

    @staticmethod
    def _decode_continue(token: str) -> tuple[Key, str]:
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode()))
            return (str(data["k"][0]), str(data["k"][1])), str(data["rv"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise bad_request(f"invalid continue token: {exc}") from exc

    def list(
        self,
        resource: str | ResourceType,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        """Deep copies of the matching objects (all namespaces when ``namespace`` is None)."""
        rt = self.resolve(resource)
        items, _, _ = self.list_raw(
            rt, namespace, LabelSelector.parse(label_selector), FieldSelector.parse(field_selector),
        )
        return [copy_obj(o) for o in items]

    def pods_on_node(self, node: str) -> builtins.list[Obj]:
        """Pods bound to ``node`` via the nodeName index (stored dicts: do not mutate)."""
        table = self._tables[("", "pods")]
        assert table.by_node is not None
        return [table.objects[k] for k in table.by_node.get(node, ())]

    # ------------------------------------------------------------------ create

    def create(
        self,
        resource: str | ResourceType,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
        field_manager: str | None = None,
    ) -> Obj:
        """Create an object (POST semantics); returns a deep copy of what was stored."""
        rt, namespace = self._resolve_for_obj(resource, obj, namespace)
        return copy_obj(
            self.create_raw(rt, obj, namespace, dry_run=dry_run, field_manager=field_manager)
        )

    def _check_kind(self, rt: ResourceType, obj: Mapping[str, Any], version: str | None) -> None:
        kind = obj.get("kind")
        if kind and kind != rt.kind:
            raise bad_request(
                f"the kind {kind!r} of the object does not match the resource {rt.qualified} "
                f"(kind {rt.kind!r})"
            )
        api_version = obj.get("apiVersion")
        if api_version:
            group, _, ver = str(api_version).rpartition("/")
            if group != rt.group or ver not in rt.versions:
                raise bad_request(
                    f"apiVersion {api_version!r} does not match the resource {rt.qualified}"
                )

    def _check_namespace(self, rt: ResourceType, obj: Obj, namespace: str | None) -> None:
        meta = obj["metadata"]
        if not rt.namespaced:
            meta.pop("namespace", None)
            return
        body_ns = meta.get("namespace")
        if body_ns and namespace and body_ns != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        ns = namespace or body_ns
        if not ns:
            raise bad_request(f"{rt.qualified} is namespaced: a namespace is required")
        meta["namespace"] = ns
        ns_obj = self._tables[("", "namespaces")].objects.get(("", ns))
        if ns_obj is None:
            raise errors.not_found("namespaces", "", ns)
        if _meta(ns_obj).get("deletionTimestamp"):
            raise ApiError(
                403, "Forbidden",
                f'{rt.qualified} "{meta.get("name", "")}" is forbidden: unable to create new '
                f"content in namespace {ns} because it is being terminated",
            )

    def create_raw(
        self,
        rt: ResourceType,
        body: Mapping[str, Any],
        namespace: str | None,
        *,
        version: str | None = None,
        dry_run: bool = False,
        field_manager: str | None = None,
        managed_fields: builtins.list[Obj] | None = None,
    ) -> Obj:
        if not isinstance(body, Mapping):
            raise bad_request("the request body must be a JSON object")
        self._check_kind(rt, body, version)
        obj: Obj = jcopy(dict(body))
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        obj["apiVersion"] = rt.api_version(version)
        obj["kind"] = rt.kind
        name = self._assign_name(rt, meta)
        self._check_namespace(rt, obj, namespace)
        table = self.table(rt)
        key = self._key(rt, name, meta.get("namespace"))
        if key in table.objects:
            raise errors.already_exists(rt.plural, rt.group, name)
        if rt.key == (CRD_GROUP, "customresourcedefinitions"):
            crd_type = types_from_crd(obj)  # validate before storing
            existing = self.registry.get(crd_type.group, crd_type.plural)
            if existing is not None and existing.builtin:
                raise errors.invalid(
                    rt.kind, rt.group, name, "spec.names.plural",
                    f"{crd_type.qualified} is a built-in resource",
                )
        for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        meta["uid"] = self._new_uid()
        meta["creationTimestamp"] = now_iso()
        meta["generation"] = 1
        if managed_fields is not None:
            meta["managedFields"] = managed_fields
        else:
            meta.pop("managedFields", None)
            self._set_managed(meta, field_manager, "Update", None, rt.api_version(version))
        if rt.status_subresource and rt.key != ("", "nodes"):
            # Create ignores status where a status subresource owns it (nodes excepted: the
            # kubelet registers a Node together with its status).
            obj.pop("status", None)
        self._defaults(rt, obj)
        obj = self._pruned(rt, obj)
        if dry_run:
            return obj
        meta["resourceVersion"] = self._next_rv()
        table.put(key, obj, None)
        self._index_owners(rt, key, None, obj)
        self._uids[meta["uid"]] = (rt.key, key)
        self._emit(table, WatchEvent("ADDED", obj, self._rv))
        if rt.key == (CRD_GROUP, "customresourcedefinitions"):
            self._register_crd(obj)
            obj = self._tables[rt.key].objects[key]
        self._collect_if_orphaned(rt, key, obj)
        return obj

    def _assign_name(self, rt: ResourceType, meta: Obj) -> str:
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise errors.invalid(
                    rt.kind, rt.group, "", "metadata.name",
                    "Required value: name or generateName is required",
                )
            meta["name"] = prefix + "".join(self._rng.choice(_NAME_CHARS) for _ in range(5))
        name = meta["name"]
        if not isinstance(name, str) or not _valid_name(name):
            raise errors.invalid(
                rt.kind, rt.group, str(name), "metadata.name",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower '
                "case alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character",
            )
        return name

    def _pruned(self, rt: ResourceType, obj: Obj) -> Obj:
        if rt.builtin or not self.prune_unknown_fields:
            return obj
        schema = rt.schema_for(rt.storage_version)
        return prune(obj, schema, root=True) if schema is not None else obj

    def _defaults(self, rt: ResourceType, obj: Obj) -> None:
        if rt.key == ("", "pods"):
            status = obj.setdefault("status", {})
            status.setdefault("phase", "Pending")
            obj.setdefault("spec", {})
        elif rt.key == ("", "namespaces"):
            obj.setdefault("status", {})["phase"] = "Active"
            obj.setdefault("spec", {}).setdefault("finalizers", [])

    @staticmethod
    def _set_managed(
        meta: Obj, manager: str | None, operation: str, subresource: str | None, api_version: str,
    ) -> None:
        # Field sets are not tracked; entries only name who wrote what, when (kubectl shows them).
        if not manager:
            return
        entries = [
            e for e in meta.get("managedFields") or []
            if not (e.get("manager") == manager and e.get("operation") == operation
                    and e.get("subresource") == subresource)
        ]
        entry: Obj = {
            "manager": manager, "operation": operation, "apiVersion": api_version,
            "time": now_iso(), "fieldsType": "FieldsV1", "fieldsV1": {},
        }
        if subresource:
            entry["subresource"] = subresource
        entries.append(entry)
        meta["managedFields"] = entries

    # ------------------------------------------------------------------ updates

    def replace_raw(
        self,
        rt: ResourceType,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None,
        *,
        subresource: str | None = None,
        version: str | None = None,
        dry_run: bool = False,
        field_manager: str | None = None,
    ) -> Obj:
        if not isinstance(body, Mapping):
            raise bad_request("the request body must be a JSON object")
        self._check_kind(rt, body, version)
        body_name = _meta(body).get("name")
        if body_name and body_name != name:
            raise bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        body_ns = _meta(body).get("namespace")
        if rt.namespaced and body_ns and namespace and body_ns != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        old = self.get_raw(rt, name, namespace)
        new = jcopy(dict(body))
        new.setdefault("metadata", {})
        return self._update(
            rt, old, new, subresource, expected_rv=_meta(body).get("resourceVersion"),
            version=version, dry_run=dry_run, field_manager=field_manager, operation="Update",
        )

    def patch(
        self,
        resource: str | ResourceType,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool = False,
    ) -> Obj:
        """PATCH semantics; ``patch_type`` is merge, json, strategic or apply."""
        rt = self.resolve(resource)
        return copy_obj(
            self.patch_raw(
                rt, name, patch, namespace or self._default_ns(rt), patch_type=patch_type,
                subresource=subresource, field_manager=field_manager, force=force,
            )
        )

    def patch_raw(
        self,
        rt: ResourceType,
        name: str,
        patch: Any,
        namespace: str | None,
        *,
        patch_type: str,
        subresource: str | None = None,
        version: str | None = None,
        dry_run: bool = False,
        field_manager: str | None = None,
        force: bool = False,
    ) -> Obj:
        if patch_type not in PATCH_TYPES:
            raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {patch_type!r}")
        if patch_type == "strategic" and not rt.builtin:
            raise ApiError(
                415, "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                "include: application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml",
            )
        table = self.table(rt)
        old = table.objects.get(self._key(rt, name, namespace))
        if old is None:
            if patch_type != "apply" or subresource:
                raise errors.not_found(rt.plural, rt.group, name)
            return self._create_by_apply(rt, name, patch, namespace, version, dry_run,
                                         field_manager)
        if patch_type == "apply":
            new, expected_rv, managed = self._applied(
                rt, old, patch, version, field_manager, force, subresource)
        else:
            new, expected_rv = self._patched(old, patch, patch_type)
            managed = None
        new = jcopy(new) if new is old else new
        if not isinstance(new, dict):
            raise ApiError(422, "Invalid", "the patched object is not a JSON object")
        return self._update(
            rt, old, new, subresource, expected_rv=expected_rv, version=version,
            dry_run=dry_run, field_manager=field_manager,
            operation="Apply" if patch_type == "apply" else "Update", managed=managed,
        )

    def _create_by_apply(
        self, rt: ResourceType, name: str, patch: Any, namespace: str | None,
        version: str | None, dry_run: bool, field_manager: str | None,
    ) -> Obj:
        if not field_manager:
            raise errors.invalid(
                rt.kind, rt.group, name, "fieldManager",
                "Required value: is required for apply patch",
            )
        if not isinstance(patch, Mapping):
            raise bad_request("an apply patch must be a YAML or JSON object")
        body = dict(patch)
        body["metadata"] = {**(body.get("metadata") or {}), "name": name}
        entry = {
            "manager": field_manager, "operation": "Apply", "apiVersion": rt.api_version(version),
            "time": now_iso(), "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(field_paths(
                self._apply_scope(rt, body, None), rt.schema_for(version))),
        }
        return self.create_raw(
            rt, body, namespace, version=version, dry_run=dry_run, managed_fields=[entry],
        )

    @staticmethod
    def _apply_scope(
        rt: ResourceType, applied: Mapping[str, Any], subresource: str | None,
    ) -> dict[str, Any]:
        """The part of an applied configuration the endpoint may change (what it owns)."""
        if subresource == "status":
            return {"status": applied["status"]} if "status" in applied else {}
        if rt.status_subresource:
            return {k: v for k, v in applied.items() if k != "status"}
        return dict(applied)

    def _applied(
        self, rt: ResourceType, old: Obj, patch: Any, version: str | None,
        field_manager: str | None, force: bool, subresource: str | None,
    ) -> tuple[Any, str | None, builtins.list[Obj]]:
        """Server-side apply: (merged object, required resourceVersion, new managedFields)."""
        name = old["metadata"]["name"]
        if not field_manager:
            raise errors.invalid(
                rt.kind, rt.group, name, "fieldManager",
                "Required value: is required for apply patch",
            )
        if not isinstance(patch, Mapping):
            raise bad_request("an apply patch must be a YAML or JSON object")
        self._check_kind(rt, patch, version)
        schema = rt.schema_for(version)
        base, managed = plan_apply(
            old, self._apply_scope(rt, patch, subresource), schema, field_manager,
            force=force, subresource=subresource, api_version=rt.api_version(version),
            now=now_iso(),
        )
        return apply_merge(base, patch, schema), _meta(patch).get("resourceVersion"), managed

    def _patched(self, old: Obj, patch: Any, patch_type: str) -> tuple[Any, str | None]:
        """The patched object and the resourceVersion the patch requires (if any)."""
        expected_rv: str | None = None
        if patch_type == "merge":
            if not isinstance(patch, Mapping):
                raise bad_request("a merge patch must be a JSON object")
            expected_rv = _meta(patch).get("resourceVersion")
            return merge_patch(old, patch), expected_rv
        if patch_type == "strategic":
            if isinstance(patch, Mapping):
                expected_rv = _meta(patch).get("resourceVersion")
            return strategic_merge_patch(old, patch), expected_rv
        new = json_patch(old, patch)
        after_rv = _meta(new).get("resourceVersion")
        if after_rv != _meta(old).get("resourceVersion"):
            expected_rv = after_rv
        return new, expected_rv

    def _merged_for_endpoint(
        self, rt: ResourceType, old: Obj, new: Obj, subresource: str | None,
    ) -> Obj:
        """Keep what the endpoint may not change: all but status on /status, status on the
        main resource (when a status subresource exists), and server-owned metadata."""
        old_meta = old["metadata"]
        name = old_meta["name"]
        if subresource == "status":
            # The status subresource changes only status; everything else keeps its old value.
            result = dict(old)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
            result["metadata"] = dict(old_meta)
        else:
            result = new
            if not isinstance(result.get("metadata"), dict):
                raise bad_request("metadata must be an object")
            if rt.status_subresource:
                # On resources with a status subresource the main endpoint ignores status.
                if "status" in old:
                    result["status"] = old["status"]
                else:
                    result.pop("status", None)
            meta = result["metadata"] = dict(result["metadata"])
            for field in ("uid", "creationTimestamp", "name", "namespace", "generation",
                          "deletionTimestamp", "deletionGracePeriodSeconds"):
                if field in old_meta:
                    meta[field] = old_meta[field]
                else:
                    meta.pop(field, None)
            if old_meta.get("deletionTimestamp"):
                added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
                if added:
                    raise errors.invalid(
                        rt.kind, rt.group, name, "metadata.finalizers",
                        "Forbidden: no new finalizers can be added if the object is being "
                        "deleted",
                    )
            if _spec_part(result) != _spec_part(old):
                meta["generation"] = int(old_meta.get("generation") or 1) + 1
        return result

    def _update(
        self,
        rt: ResourceType,
        old: Obj,
        new: Obj,
        subresource: str | None,
        *,
        expected_rv: str | None,
        version: str | None,
        dry_run: bool,
        field_manager: str | None,
        operation: str,
        managed: builtins.list[Obj] | None = None,
    ) -> Obj:
        old_meta = old["metadata"]
        name = old_meta["name"]
        if expected_rv not in (None, "") and str(expected_rv) != old_meta.get("resourceVersion"):
            raise errors.conflict(rt.plural, rt.group, name)
        if subresource not in (None, "status"):
            raise errors.not_found(rt.plural, rt.group, f"{name}/{subresource}")
        if subresource == "status" and not rt.status_subresource:
            raise errors.not_found(rt.plural, rt.group, f"{name}/status")
        result = self._pruned(rt, self._merged_for_endpoint(rt, old, new, subresource))
        result["apiVersion"] = old["apiVersion"]
        result["kind"] = rt.kind
        meta = result["metadata"]
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        meta["managedFields"] = managed if managed is not None else old_meta.get("managedFields")
        if meta["managedFields"] is None:
            meta.pop("managedFields")
        if rt.key == (CRD_GROUP, "customresourcedefinitions") and subresource is None:
            types_from_crd(result)
        if result == old:
            # A no-op write keeps the resourceVersion and emits no event, like the apiserver.
            return old
        if managed is None:
            self._set_managed(
                meta, field_manager, operation, subresource, rt.api_version(version))
        if dry_run:
            return result
        meta["resourceVersion"] = self._next_rv()
        table = self._tables[rt.key]
        key = self._key(rt, name, old_meta.get("namespace"))
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(rt, key, result)
        table.put(key, result, old)
        self._index_owners(rt, key, old, result)
        self._emit(table, WatchEvent("MODIFIED", result, self._rv, old))
        if rt.key == (CRD_GROUP, "customresourcedefinitions"):
            self._register_crd(result)
            result = table.objects[key]
        self._collect_if_orphaned(rt, key, result)
        return result

    # ------------------------------------------------------------------ delete and GC

    def delete(
        self,
        resource: str | ResourceType,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str = "Background",
        preconditions: Mapping[str, Any] | None = None,
    ) -> Obj:
        """DELETE semantics: finalizers defer removal by setting deletionTimestamp."""
        rt = self.resolve(resource)
        return copy_obj(
            self.delete_raw(
                rt, name, namespace or self._default_ns(rt), propagation=propagation,
                preconditions=preconditions,
            )
        )

    def delete_raw(
        self,
        rt: ResourceType,
        name: str,
        namespace: str | None,
        *,
        propagation: str | None = "Background",
        preconditions: Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> Obj:
        propagation = propagation or "Background"
        if propagation not in ("Background", "Foreground", "Orphan"):
            # A real API server validates DeleteOptions: 422 Invalid, not 400.
            raise invalid("DeleteOptions", "", "", "propagationPolicy",
                          f"Unsupported value: {propagation!r}: supported values: "
                          '"Foreground", "Background", "Orphan"')
        obj = self.get_raw(rt, name, namespace)
        meta = obj["metadata"]
        self._check_preconditions(rt, meta, preconditions)
        if dry_run:
            return obj
        key = self._key(rt, name, namespace)
        if propagation == "Orphan":
            self._orphan_dependents(meta["uid"])
        elif propagation == "Foreground":
            self._delete_dependents_first(meta["uid"])
            obj = self.get_raw(rt, name, namespace)
            meta = obj["metadata"]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return obj
            new = dict(obj)
            new["metadata"] = {
                **meta, "deletionTimestamp": now_iso(), "deletionGracePeriodSeconds": 0,
                "resourceVersion": self._next_rv(),
            }
            if rt.key == ("", "namespaces"):
                new["status"] = {**(obj.get("status") or {}), "phase": "Terminating"}
            table = self._tables[rt.key]
            table.put(key, new, obj)
            self._emit(table, WatchEvent("MODIFIED", new, self._rv, obj))
            if rt.key == ("", "namespaces"):
                self._delete_namespace_contents(name)
            return new
        if rt.key == ("", "namespaces"):
            self._delete_namespace_contents(name)
        return self._remove(rt, key, obj)

    @staticmethod
    def _check_preconditions(
        rt: ResourceType, meta: Mapping[str, Any], preconditions: Mapping[str, Any] | None,
    ) -> None:
        for field in ("uid", "resourceVersion"):
            want = (preconditions or {}).get(field)
            if want is not None and want != meta.get(field):
                raise errors.conflict(
                    rt.plural, rt.group, meta.get("name", ""),
                    f"Precondition failed: {field}: {want}, {field} in object meta: "
                    f"{meta.get(field)}",
                )

    def _delete_dependents_first(self, owner_uid: str) -> None:
        # Approximation of foreground deletion: dependents are deleted first and synchronously
        # instead of the owner waiting behind a foregroundDeletion finalizer.
        for dep_rt_key, dep_key in sorted(self._dependents.get(owner_uid, ())):
            dep_table = self._tables.get(dep_rt_key)
            if dep_table is not None and dep_key in dep_table.objects:
                self.delete_raw(
                    dep_table.rt, dep_key[1], dep_key[0] or None, propagation="Foreground",
                )

    def _remove(self, rt: ResourceType, key: Key, obj: Obj) -> Obj:
        table = self._tables[rt.key]
        table.drop(key)
        final = dict(obj)
        final["metadata"] = {**obj["metadata"], "resourceVersion": self._next_rv()}
        uid = final["metadata"].get("uid")
        self._uids.pop(uid, None)
        self._index_owners(rt, key, obj, None)
        self._emit(table, WatchEvent("DELETED", final, self._rv))
        if rt.key == (CRD_GROUP, "customresourcedefinitions"):
            self._unregister_crd(obj)
        if uid:
            self._collect_dependents(uid)
        return final

    def _delete_namespace_contents(self, namespace: str) -> None:
        # Approximation of the namespace controller: contents go at once (finalizers honoured),
        # the namespace itself does not wait for finalized contents to disappear.
        for table in list(self._tables.values()):
            if not table.rt.namespaced:
                continue
            for name in list(table.by_ns.get(namespace, {})):
                if (namespace, name) in table.objects:
                    self.delete_raw(table.rt, name, namespace)

    def _index_owners(self, rt: ResourceType, key: Key, old: Obj | None, new: Obj | None) -> None:
        before = _owner_uids(old) if old else set()
        after = _owner_uids(new) if new else set()
        if before == after:
            return
        ref = (rt.key, key)
        for uid in before - after:
            deps = self._dependents.get(uid)
            if deps is not None:
                deps.discard(ref)
                if not deps:
                    del self._dependents[uid]
        for uid in after - before:
            self._dependents.setdefault(uid, set()).add(ref)

    def _owner_is_collectable(self, ref: Mapping[str, Any]) -> bool:
        """True when ``ref`` names a served type and no object with its uid exists."""
        if ref.get("uid") in self._uids:
            return False
        try:
            self.registry.for_api_version(str(ref.get("apiVersion", "")), str(ref.get("kind", "")))
        except ApiError:
            # The garbage collector leaves dependents of kinds it cannot resolve alone.
            return False
        return True

    def _collect_if_orphaned(self, rt: ResourceType, key: Key, obj: Obj) -> None:
        refs = _meta(obj).get("ownerReferences") or []
        if refs and all(isinstance(r, dict) and self._owner_is_collectable(r) for r in refs):
            if _meta(obj).get("deletionTimestamp"):
                return
            if key in self._tables[rt.key].objects:
                self.delete_raw(rt, key[1], key[0] or None)

    def _collect_dependents(self, owner_uid: str) -> None:
        """Background garbage collection: delete dependents whose owners are all gone."""
        for dep_rt_key, dep_key in sorted(self._dependents.pop(owner_uid, set())):
            table = self._tables.get(dep_rt_key)
            obj = table.objects.get(dep_key) if table is not None else None
            if table is None or obj is None:
                continue
            self._collect_if_orphaned(table.rt, dep_key, obj)

    def _orphan_dependents(self, owner_uid: str) -> None:
        for dep_rt_key, dep_key in sorted(self._dependents.get(owner_uid, set())):
            table = self._tables.get(dep_rt_key)
            obj = table.objects.get(dep_key) if table is not None else None
            if table is None or obj is None:
                continue
            refs = [
                r for r in obj["metadata"].get("ownerReferences") or []
                if r.get("uid") != owner_uid
            ]
            patch = {"metadata": {"ownerReferences": refs or None}}
            self.patch_raw(table.rt, dep_key[1], patch, dep_key[0] or None, patch_type="merge")

    # ------------------------------------------------------------------ pods

    def bind(
        self, name: str, namespace: str, node: str, *, phase: str | None = None,
    ) -> Obj:
        """The pods/binding subresource: set ``spec.nodeName`` once (409 if already bound)."""
        rt = self.registry.get("", "pods")
        assert rt is not None
        pod = self.get_raw(rt, name, namespace)
        if (pod.get("spec") or {}).get("nodeName"):
            raise errors.conflict(
                "pods", "", name,
                f"pod {name} is already assigned to node \"{pod['spec']['nodeName']}\"",
            )
        if _meta(pod).get("deletionTimestamp"):
            raise errors.conflict("pods", "", name, "pod is being deleted")
        new = jcopy(pod)
        new["spec"]["nodeName"] = node
        status = new.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append({
            "type": "PodScheduled", "status": "True", "lastProbeTime": None,
            "lastTransitionTime": now_iso(),
        })
        status["conditions"] = conditions
        if phase:
            status["phase"] = phase
        table = self._tables[rt.key]
        key = (namespace, name)
        new["metadata"]["resourceVersion"] = self._next_rv()
        table.put(key, new, pod)
        self._emit(table, WatchEvent("MODIFIED", new, self._rv, pod))
        return copy_obj(new)

    # ------------------------------------------------------------------ watch

    def watch(
        self,
        resource: str | ResourceType,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        version: str | None = None,
    ) -> Watcher:
        """Open a watch. Without ``resource_version`` (or with "0") the current objects come
        first as ADDED; with one, the retained events after it are replayed, or 410 Gone is
        raised when they are no longer retained. Close it with ``watcher.close()``."""
        rt = self.resolve(resource)
        return self.watch_raw(
            rt, namespace, resource_version, LabelSelector.parse(label_selector),
            FieldSelector.parse(field_selector), version=version,
        )

    def watch_raw(
        self,
        rt: ResourceType,
        namespace: str | None,
        resource_version: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        *,
        version: str | None = None,
    ) -> Watcher:
        table = self.table(rt)
        api_version = rt.api_version(version) if version and len(rt.versions) > 1 else None
        watcher = Watcher(
            rt.key, namespace if rt.namespaced else None, matcher(labels, fields),
            self.watch_queue, api_version,
        )
        if resource_version in (None, "", "0"):
            items, _, _ = self.list_raw(rt, namespace, labels, fields)
            for obj in items:
                watcher.push("ADDED", WatchEvent("ADDED", obj, int(obj["metadata"].get(
                    "resourceVersion") or 0)))
        else:
            try:
                since = int(str(resource_version))
            except ValueError as exc:
                raise bad_request(f"invalid resourceVersion {resource_version!r}") from exc
            if since < table.compacted_rv:
                raise errors.gone(
                    f"too old resource version: {since} ({table.compacted_rv})"
                )
            # Ahead of the store (a client of an API server that came back with another
            # etcd): accepted, and silent until the store passes it, as on the apiserver.
            watcher.since = since
            for ev in table.events:
                if ev.rv > since:
                    watcher.offer(ev)
        table.watchers.add(watcher)
        watcher.on_close = lambda w: table.watchers.discard(w)
        return watcher

    # ------------------------------------------------------------------ CRDs

    def _register_crd(self, crd: Obj) -> None:
        rt = types_from_crd(crd)
        old = self.registry.get(rt.group, rt.plural)
        self.registry.add(rt)
        table = self._tables.get(rt.key)
        if table is None:
            self._tables[rt.key] = Table(rt, self.history)
        else:
            table.rt = rt
        if old is None or old != rt:
            self._mark_established(crd, rt)

    def _mark_established(self, crd: Obj, rt: ResourceType) -> None:
        names = dict(crd["spec"].get("names") or {})
        names.setdefault("singular", rt.singular)
        names.setdefault("listKind", rt.list_kind)
        ts = now_iso()
        status = {
            "acceptedNames": names,
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": ts},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": ts},
            ],
            "storedVersions": [rt.storage_version],
        }
        if crd.get("status") == status:
            return
        crd_rt = self.registry.get(CRD_GROUP, "customresourcedefinitions")
        assert crd_rt is not None
        self.patch_raw(
            crd_rt, crd["metadata"]["name"], {"status": status}, None, patch_type="merge",
            subresource="status",
        )

    def _unregister_crd(self, crd: Obj) -> None:
        try:
            rt = types_from_crd(crd)
        except ApiError:
            return
        self.registry.remove(rt.key)
        table = self._tables.pop(rt.key, None)
        if table is not None:
            for w in list(table.watchers):
                w.close("resource type removed")
            for obj in table.objects.values():
                self._uids.pop(_meta(obj).get("uid", ""), None)

    def serve(self, rt: ResourceType) -> ResourceType:
        """Serve a built-in-like resource type that has no CRD object (e.g. a core type the
        sandbox lacks). Registering an existing type again is a no-op."""
        existing = self.registry.get(rt.group, rt.plural)
        if existing is not None:
            return existing
        self.registry.add(rt)
        self._tables[rt.key] = Table(rt, self.history)
        return rt

    def register_crd(self, crd: Mapping[str, Any]) -> ResourceType:
        """Create (or update) a CustomResourceDefinition; its resources are served at once."""
        name = _meta(crd).get("name", "")
        crd_rt = self.registry.get(CRD_GROUP, "customresourcedefinitions")
        assert crd_rt is not None
        if ("", name) in self._tables[crd_rt.key].objects:
            current = self._tables[crd_rt.key].objects[("", name)]
            body = jcopy(dict(crd))
            body.setdefault("metadata", {})["resourceVersion"] = current["metadata"][
                "resourceVersion"]
            self.replace_raw(crd_rt, name, body, None)
        else:
            self.create_raw(crd_rt, crd, None)
        rt = types_from_crd(dict(crd))
        found = self.registry.get(rt.group, rt.plural)
        assert found is not None
        return found

    def load_crd_file(self, path: str | Path) -> builtins.list[ResourceType]:
        """Register every CustomResourceDefinition document of a YAML file."""
        text = Path(path).read_text()
        try:
            docs = [d for d in yamlio.load_all(text) if d]
        except yaml.YAMLError as exc:
            raise bad_request(f"{path}: invalid YAML: {exc}") from exc
        registered = []
        for doc in docs:
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            registered.append(self.register_crd(doc))
        return registered

    def load_crd_dir(self, directory: str | Path) -> builtins.list[ResourceType]:
        """Register the CRDs of every ``*.yaml``/``*.yml`` file in ``directory`` (sorted)."""
        root = Path(directory)
        if not root.is_dir():
            raise FileNotFoundError(f"CRD directory {root} does not exist")
        registered: builtins.list[ResourceType] = []
        for path in sorted([*root.glob("*.yaml"), *root.glob("*.yml")]):
            registered.extend(self.load_crd_file(path))
        return registered
