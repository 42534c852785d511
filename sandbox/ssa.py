"""Field ownership for server-side apply: which manager applied which fields.

Each Apply manager's fields are kept in ``metadata.managedFields[].fieldsV1`` in the real
format (``{"f:spec": {"f:size": {}}}``, list-map items as ``k:{"type":"Ready"}``, set items as
``v:"x"``). Applying:

- conflicts (409, unless ``force``) when a field the applier sets to a *different* value is
  owned by another Apply manager; with ``force`` the field changes owner;
- removes fields the same manager applied before and omits now, when nobody else owns them;
- then merges the applied configuration (associative lists by key, see ``sandbox.patch``).

Approximation: Update operations (PUT, PATCH) are recorded as managers but own no fields, so
they never cause apply conflicts and never protect fields from removal.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from sandbox.errors import ApiError
from sandbox.jsoncopy import copy_obj
from sandbox.patch import child_schema, item_schema, list_merge_kind

Path = tuple[str, ...]
# Identity fields the apiserver never lists in managedFields.
_SKIP_TOP = frozenset({"apiVersion", "kind"})
_METADATA_TRACKED = frozenset({"labels", "annotations", "finalizers", "ownerReferences"})


def field_paths(applied: Mapping[str, Any], schema: dict[str, Any] | None) -> set[Path]:
    """The leaf field paths set by an applied configuration."""
    out: set[Path] = set()
    for key, value in applied.items():
        if key in _SKIP_TOP:
            continue
        if key == "metadata" and isinstance(value, Mapping):
            for mkey, mval in value.items():
                if mkey in _METADATA_TRACKED:
                    _walk(("f:metadata", f"f:{mkey}"), mkey, mval, None, out)
            continue
        _walk((f"f:{key}",), key, value, child_schema(schema, key), out)
    return out


def _walk(
    prefix: Path, name: str, value: Any, schema: dict[str, Any] | None, out: set[Path],
) -> None:
    if isinstance(value, Mapping) and value:
        for key, child in value.items():
            _walk((*prefix, f"f:{key}"), key, child, child_schema(schema, key), out)
        return
    if isinstance(value, list) and value:
        kind, keys = list_merge_kind(name, schema)
        if kind == "set":
            out.update((*prefix, "v:" + json.dumps(v, sort_keys=True)) for v in value)
            return
        if kind == "map" and all(isinstance(v, Mapping) and keys[0] in v for v in value):
            items_schema = item_schema(schema)
            for item in value:
                ident = {k: item[k] for k in keys if k in item}
                item_path = (*prefix, "k:" + json.dumps(ident, sort_keys=True,
                                                        separators=(",", ":")))
                for key, child in item.items():
                    _walk((*item_path, f"f:{key}"), key, child,
                          child_schema(items_schema, key), out)
            return
    out.add(prefix)


def to_fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for seg in path:
            node = node.setdefault(seg, {})
    return root


def from_fields_v1(fields: Mapping[str, Any] | None) -> set[Path]:
    out: set[Path] = set()

    def rec(prefix: Path, node: Mapping[str, Any]) -> None:
        if not node:
            if prefix:
                out.add(prefix)
            return
        for seg, child in node.items():
            if seg == ".":
                continue
            rec((*prefix, seg), child if isinstance(child, Mapping) else {})

    rec((), fields or {})
    return out


def _step(container: Any, seg: str) -> tuple[bool, Any]:
    if seg.startswith("f:"):
        if isinstance(container, Mapping) and seg[2:] in container:
            return True, container[seg[2:]]
        return False, None
    if isinstance(container, list):
        want = json.loads(seg[2:])
        for item in container:
            if seg.startswith("k:") and isinstance(item, Mapping) and all(
                item.get(k) == v for k, v in want.items()
            ):
                return True, item
            if seg.startswith("v:") and item == want:
                return True, item
    return False, None


def value_at(obj: Any, path: Path) -> tuple[bool, Any]:
    cur = obj
    for seg in path:
        found, cur = _step(cur, seg)
        if not found:
            return False, None
    return True, cur


def remove_at(obj: dict[str, Any], path: Path) -> dict[str, Any]:
    """A copy of ``obj`` without the field or list item at ``path`` (no-op when absent)."""
    if not value_at(obj, path)[0]:
        return obj
    out = copy_obj(obj)
    parent_found, parent = value_at(out, path[:-1])
    if not parent_found:
        return obj
    seg = path[-1]
    if seg.startswith("f:") and isinstance(parent, dict):
        parent.pop(seg[2:], None)
    elif isinstance(parent, list):
        found, item = _step(parent, seg)
        if found:
            parent.remove(item)
    return out


def _managers(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(e) for e in meta.get("managedFields") or [] if isinstance(e, Mapping)]


def _conflict_error(name: str, conflicts: list[tuple[str, Path]]) -> ApiError:
    def dotted(path: Path) -> str:
        return "".join(f".{s[2:]}" if s.startswith("f:") else f"[{s[2:]}]" for s in path)

    causes = [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}"',
               "field": dotted(p)} for m, p in conflicts]
    lines = "\n".join(f'- conflict with "{m}": {dotted(p)}' for m, p in conflicts)
    return ApiError(
        409, "Conflict",
        f"Apply failed with {len(conflicts)} conflict{'s' if len(conflicts) > 1 else ''}:"
        f"\n{lines}",
        name=name, causes=causes,
    )


def _settle_conflicts(
    entries: list[dict[str, Any]], manager: str, mine: set[Path], current: Mapping[str, Any],
    applied: Mapping[str, Any], force: bool, name: str,
) -> None:
    """Raise on fields other Apply managers own with another value; with ``force`` take them."""
    conflicts: list[tuple[str, Path]] = []
    for entry in entries:
        if entry.get("operation") != "Apply" or entry.get("manager") == manager:
            continue
        theirs = from_fields_v1(entry.get("fieldsV1"))
        clash = sorted(p for p in theirs & mine if value_at(current, p) != value_at(applied, p))
        if clash and not force:
            conflicts.extend((str(entry.get("manager")), p) for p in clash)
        elif clash:
            entry["fieldsV1"] = to_fields_v1(theirs - set(clash))
    if conflicts:
        raise _conflict_error(name, conflicts)


def _remove_unowned(
    obj: dict[str, Any], dropped: set[Path], still_owned: set[Path],
) -> dict[str, Any]:
    for path in sorted(dropped):
        # Remove the shallowest part of the path that nobody owns any more.
        for depth in range(1, len(path) + 1):
            prefix = path[:depth]
            if not any(p[:depth] == prefix for p in still_owned):
                obj = remove_at(obj, prefix)
                break
    return obj


def plan_apply(
    current: dict[str, Any],
    applied: Mapping[str, Any],
    schema: dict[str, Any] | None,
    manager: str,
    *,
    force: bool,
    subresource: str | None,
    api_version: str,
    now: str,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(object with this manager's dropped fields removed, new managedFields list).

    Raises a 409 ApiError listing every conflicting field unless ``force``.
    """
    meta = current.get("metadata") or {}
    entries = _managers(meta)
    mine = field_paths(applied, schema)
    _settle_conflicts(entries, manager, mine, current, applied, force, str(meta.get("name", "")))
    previous = next(
        (e for e in entries if e.get("manager") == manager and e.get("operation") == "Apply"
         and e.get("subresource") == subresource),
        None,
    )
    owned_by_others: set[Path] = set()
    for entry in entries:
        if entry is not previous and entry.get("operation") == "Apply":
            owned_by_others |= from_fields_v1(entry.get("fieldsV1"))
    result = current
    if previous is not None:
        dropped = from_fields_v1(previous.get("fieldsV1")) - mine - owned_by_others
        result = _remove_unowned(current, dropped, mine | owned_by_others)
    fields = to_fields_v1(mine)
    time = previous.get("time", now) if previous and previous.get("fieldsV1") == fields else now
    entry = {"manager": manager, "operation": "Apply", "apiVersion": api_version,
             "time": time, "fieldsType": "FieldsV1", "fieldsV1": fields}
    if subresource:
        entry["subresource"] = subresource
    new_entries = [e for e in entries if e is not previous and (
        e.get("operation") != "Apply" or e.get("fieldsV1"))]
    new_entries.append(entry)
    return result, new_entries
