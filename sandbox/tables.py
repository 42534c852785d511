"""meta.k8s.io/v1 Table rendering for kubectl (``Accept: application/json;as=Table``): fixed
columns for pods, nodes and namespaces, CRD ``additionalPrinterColumns`` for custom resources
(simple JSONPath: ``.a.b``, ``.a[0]``, ``.a[?(@.k=="v")].b``), NAME/AGE otherwise."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sandbox.resources import ResourceType

_STEP = re.compile(
    r"\.([A-Za-z0-9_\-/]+)"  # .field
    r"|\[(\d+)\]"  # [index]
    r"|\[\?\(@\.([A-Za-z0-9_]+)==[\"']([^\"']*)[\"']\)\]"  # [?(@.key=="value")]
)


def age(ts: str | None) -> str:
    if not ts:
        return "<unknown>"
    try:
        then = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    secs = max(int((datetime.now(UTC) - then).total_seconds()), 0)
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def json_path(obj: Any, path: str) -> Any:
    """Evaluate a simple JSONPath; None when it does not resolve or is unsupported."""
    pos, cur = 0, obj
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    while pos < len(path):
        m = _STEP.match(path, pos)
        if m is None:
            return None
        pos = m.end()
        if m.group(1) is not None:
            cur = cur.get(m.group(1)) if isinstance(cur, Mapping) else None
        elif m.group(2) is not None:
            idx = int(m.group(2))
            cur = cur[idx] if isinstance(cur, list) and idx < len(cur) else None
        else:
            key, want = m.group(3), m.group(4)
            cur = next((i for i in cur if isinstance(i, Mapping) and str(i.get(key)) == want),
                       None) if isinstance(cur, list) else None
        if cur is None:
            return None
    return cur


def _node_status(obj: Mapping[str, Any]) -> str:
    conds = (obj.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
    status = "Ready" if ready else "NotReady"
    if (obj.get("spec") or {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    return status


def _columns(rt: ResourceType, version: str | None) -> list[tuple[str, str, Any]]:
    """(name, type, getter) per column."""
    def name(o: Mapping[str, Any]) -> Any:
        return (o.get("metadata") or {}).get("name")

    def created(o: Mapping[str, Any]) -> Any:
        return age((o.get("metadata") or {}).get("creationTimestamp"))

    if rt.key == ("", "pods"):
        return [("Name", "string", name),
                ("Status", "string", lambda o: (o.get("status") or {}).get("phase", "")),
                ("Node", "string", lambda o: (o.get("spec") or {}).get("nodeName") or "<none>"),
                ("Age", "string", created)]
    if rt.key == ("", "nodes"):
        return [("Name", "string", name), ("Status", "string", _node_status),
                ("Age", "string", created)]
    if rt.key == ("", "namespaces"):
        return [("Name", "string", name),
                ("Status", "string", lambda o: (o.get("status") or {}).get("phase", "")),
                ("Age", "string", created)]
    columns: list[tuple[str, str, Any]] = [("Name", "string", name)]
    printer = rt.printer_columns.get(version or rt.storage_version)
    if not printer:
        return [*columns, ("Age", "string", created)]
    for col in printer:
        path, kind = str(col.get("jsonPath", "")), str(col.get("type", "string"))

        def get(o: Mapping[str, Any], path: str = path, kind: str = kind) -> Any:
            value = json_path(o, path)
            if kind == "date":
                return age(value) if isinstance(value, str) else "<unknown>"
            return "<none>" if value is None else value

        columns.append((str(col.get("name", path)), "string" if kind == "date" else kind, get))
    return columns


def table(
    rt: ResourceType, items: list[Any], rv: str, token: str | None = None, *,
    version: str | None = None,
) -> dict[str, Any]:
    columns = _columns(rt, version)
    meta: dict[str, Any] = {"resourceVersion": rv}
    if token:
        meta["continue"] = token
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
        "columnDefinitions": [
            {"name": n, "type": t, "format": "name" if n == "Name" else "", "description": "",
             "priority": 0}
            for n, t, _ in columns
        ],
        "rows": [{"cells": [get(o) for _, _, get in columns], "object": o} for o in items],
    }
