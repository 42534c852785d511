"""Patch algorithms: JSON merge patch (RFC 7386), JSON patch (RFC 6902), an approximation of
strategic merge patch, and the structural merge used for server-side apply.

Strategic merge and apply merge lists of known associative types by key (``containers`` by
``name``, ``conditions`` by ``type``, ``metadata.finalizers`` as a set ...) and, for CRDs, by the
``x-kubernetes-list-type``/``x-kubernetes-list-map-keys`` markers of the schema. Every other list
is replaced whole, which is what a real server does for atomic lists.
"""

from __future__ import annotations

from typing import Any

from sandbox.errors import ApiError, bad_request
from sandbox.jsoncopy import jcopy

# Associative lists of core types: field name -> merge key (strategic merge "patchMergeKey").
KNOWN_LIST_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "env": ("name",),
    "imagePullSecrets": ("name",),
    "conditions": ("type",),
    "addresses": ("type",),
    "taints": ("key", "effect"),
    "ownerReferences": ("uid",),
    "ports": ("containerPort",),
    "containerStatuses": ("name",),
    "initContainerStatuses": ("name",),
    "admissionChecks": ("name",),
    "podSets": ("name",),
    "resourceClaims": ("name",),
}
# Lists merged as sets of scalars (patchStrategy=merge on a primitive list).
KNOWN_SET_LISTS = frozenset({"finalizers"})


def _unprocessable(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


# ---------------------------------------------------------------------------- JSON merge patch


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return jcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = merge_patch(result.get(key), value)
        else:
            result[key] = jcopy(value)
    return result


# ---------------------------------------------------------------------------- JSON patch


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _unprocessable(f"invalid JSON pointer {path!r}: must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, *, for_add: bool) -> int:
    if token == "-" and for_add:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise _unprocessable(f"invalid array index {token!r}")
    idx = int(token)
    limit = len(container) if for_add else len(container) - 1
    if idx > limit:
        raise _unprocessable(f"array index {idx} out of bounds")
    return idx


def _parent(doc: Any, tokens: list[str], path: str) -> Any:
    cur = doc
    for token in tokens[:-1]:
        if isinstance(cur, dict):
            if token not in cur:
                raise _unprocessable(f"doc is missing path: {path!r}")
            cur = cur[token]
        elif isinstance(cur, list):
            cur = cur[_index(cur, token, for_add=False)]
        else:
            raise _unprocessable(f"doc is missing path: {path!r}")
    return cur


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _unprocessable(f"doc is missing path: {path!r}")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, for_add=False)]
    raise _unprocessable(f"doc is missing path: {path!r}")


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, for_add=True), value)
    else:
        raise _unprocessable(f"doc is missing path: {path!r}")
    return doc


def _remove(doc: Any, path: str) -> tuple[Any, Any]:
    tokens = _pointer(path)
    if not tokens:
        raise _unprocessable("cannot remove the whole document")
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _unprocessable(f"unable to remove nonexistent key: {last}: missing value")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, for_add=False))
    raise _unprocessable(f"doc is missing path: {path!r}")


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 on a deep copy of ``doc``; a failed ``test`` or a bad path raises 422."""
    if not isinstance(ops, list):
        raise bad_request("a JSON patch must be a list of operations")
    doc = jcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise bad_request(f"JSON patch operation {kind} at {path!r} needs a value")
        if kind == "add":
            doc = _add(doc, path, jcopy(op["value"]))
        elif kind == "remove":
            doc, _ = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # must exist
            doc, _ = _remove(doc, path) if _pointer(path) else (doc, None)
            doc = _add(doc, path, jcopy(op["value"]))
        elif kind == "move":
            doc, value = _remove(doc, op.get("from", ""))
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, jcopy(_get(doc, op.get("from", ""))))
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise _unprocessable(
                    f"the server rejected our request due to an error in our request: "
                    f"testing value {path} failed"
                )
        else:
            raise bad_request(f"unknown JSON patch operation {kind!r}")
    return doc


# ---------------------------------------------------------------------------- structural merges


def list_merge_kind(name: str, schema: dict[str, Any] | None) -> tuple[str, tuple[str, ...]]:
    """How a list field merges: ("map", keys), ("set", ()) or ("atomic", ())."""
    if schema is not None:
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "map":
            return "map", tuple(schema.get("x-kubernetes-list-map-keys") or ())
        if list_type == "set":
            return "set", ()
        if list_type == "atomic":
            return "atomic", ()
    if name in KNOWN_SET_LISTS:
        return "set", ()
    if name in KNOWN_LIST_KEYS:
        return "map", KNOWN_LIST_KEYS[name]
    return "atomic", ()


def child_schema(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if schema is None:
        return None
    props = schema.get("properties")
    if isinstance(props, dict) and key in props:
        child = props[key]
        return child if isinstance(child, dict) else None
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def item_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    if schema is None:
        return None
    items = schema.get("items")
    return items if isinstance(items, dict) else None


def _merge_key_of(item: Any, keys: tuple[str, ...]) -> tuple[Any, ...] | None:
    if not isinstance(item, dict) or not keys or any(k not in item for k in keys[:1]):
        return None
    return tuple(item.get(k) for k in keys)


def structural_merge(
    target: Any, patch: Any, schema: dict[str, Any] | None = None, *, strategic: bool = False,
) -> Any:
    """Merge ``patch`` into ``target``: maps recursively, associative lists by key.

    With ``strategic=True`` the strategic-merge directives are honoured: ``null`` deletes a key,
    ``$patch: delete``/``replace`` in maps and list items, ``$deleteFromPrimitiveList/<f>`` and
    ``$retainKeys``; ``$setElementOrder/<f>`` is accepted and ignored (order is not preserved).
    Without it (server-side apply), ``null`` also deletes, which is the apply behaviour for
    fields the applier explicitly nulls.
    """
    if not isinstance(patch, dict):
        return jcopy(patch)
    if strategic and patch.get("$patch") == "replace":
        return {k: jcopy(v) for k, v in patch.items() if not k.startswith("$")}
    if strategic and patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys") if strategic else None
    for key, value in patch.items():
        if key.startswith("$"):
            if strategic:
                _directive(result, key, value)
            continue
        if value is None:
            result.pop(key, None)
            continue
        sub = child_schema(schema, key)
        if isinstance(value, dict):
            merged = structural_merge(result.get(key), value, sub, strategic=strategic)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value, sub, strategic)
        else:
            result[key] = value
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _directive(result: dict[str, Any], key: str, value: Any) -> None:
    if key.startswith("$deleteFromPrimitiveList/"):
        field = key.split("/", 1)[1]
        current = result.get(field)
        if isinstance(current, list) and isinstance(value, list):
            result[field] = [v for v in current if v not in value]


def _is_directive(item: Any, which: str | None = None) -> bool:
    if not isinstance(item, dict) or "$patch" not in item:
        return False
    return which is None or item["$patch"] == which


def _merge_list(
    name: str, current: Any, patch: list[Any], schema: dict[str, Any] | None, strategic: bool,
) -> list[Any]:
    kind, keys = list_merge_kind(name, schema)
    replace = strategic and any(_is_directive(v, "replace") for v in patch)
    if not isinstance(current, list) or kind == "atomic" or replace:
        return [jcopy(v) for v in patch if not _is_directive(v)]
    if kind == "set":
        return list(current) + [jcopy(v) for v in patch if v not in current]
    out = list(current)
    positions: dict[tuple[Any, ...], int] = {}
    for i, item in enumerate(out):
        mk = _merge_key_of(item, keys)
        if mk is not None:
            positions[mk] = i
    items_schema = item_schema(schema)
    deleted: set[int] = set()
    for item in patch:
        mk = _merge_key_of(item, keys)
        if mk is None:
            out.append(jcopy(item))
            continue
        if mk in positions:
            idx = positions[mk]
            if strategic and _is_directive(item, "delete"):
                deleted.add(idx)
                continue
            out[idx] = structural_merge(out[idx], item, items_schema, strategic=strategic)
        elif not _is_directive(item, "delete"):
            positions[mk] = len(out)
            out.append(structural_merge({}, item, items_schema, strategic=strategic))
    return [item for i, item in enumerate(out) if i not in deleted]


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Approximation of Kubernetes strategic merge patch for core types (see module doc)."""
    if not isinstance(patch, dict):
        raise bad_request("a strategic merge patch must be a JSON object")
    return structural_merge(target, patch, None, strategic=True)


def apply_merge(target: Any, applied: Any, schema: dict[str, Any] | None) -> Any:
    """Server-side apply as a structural merge of the applied configuration into the object."""
    if not isinstance(applied, dict):
        raise bad_request("an apply patch must be a YAML or JSON object")
    return structural_merge(target, applied, schema, strategic=False)
