"""Which PodGroup a pod belongs to, and the name of the one request Muster keeps for a gang
PodGroup: shared by the PodGroup integration (:mod:`controller.podgroups`) and the cache,
which counts a group's pods as the consumers of that request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.api.validation import limit_object_name

SUFFIX = "gang"


def request_name(pod_group: str) -> str:
    """The one request Muster keeps per PodGroup (``<group>-gang``): also the name the
    request reconciler counts the group's bound pods under as its consumers."""
    return limit_object_name(f"{pod_group}-{SUFFIX}")


def group_of(pod: Mapping[str, Any]) -> str | None:
    """The PodGroup a pod belongs to (``spec.schedulingGroup.podGroupName``)."""
    sg = (pod.get("spec") or {}).get("schedulingGroup") or {}
    name = sg.get("podGroupName")
    return str(name) if name else None
