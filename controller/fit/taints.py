"""Which taints of a node the scheduler will hold a pod to: lasting ones versus the taints
that follow a node condition or the cordon (pure; the one place that tells them apart).

The node lifecycle controller (``TaintNodesByCondition``) keeps a taint on a node while one
of its conditions is bad and removes it once the condition clears, and keeps
``node.kubernetes.io/unschedulable:NoSchedule`` exactly while ``spec.unschedulable`` is set.
So a Ready node that still carries ``node.kubernetes.io/not-ready`` (a node that just
registered, before the controller's next pass) loses that taint in moments: it must not be
read as a permanent barrier. The other way round, a node whose condition is bad gets the
taint soon even if the controller has not added it yet.

:func:`effective_taints` is what the snapshot builder hands the fit engine for a node as it
is now; :func:`lasting_taints` is what a node keeps once it is healthy and uncordoned (the
best case the NeverFits judgement assumes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controller.fit.types import Taint

NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"

CONDITION_TAINTS: Mapping[str, tuple[str, str]] = {
    NOT_READY: ("Ready", "False"),
    UNREACHABLE: ("Ready", "Unknown"),
    "node.kubernetes.io/memory-pressure": ("MemoryPressure", "True"),
    "node.kubernetes.io/disk-pressure": ("DiskPressure", "True"),
    "node.kubernetes.io/pid-pressure": ("PIDPressure", "True"),
    "node.kubernetes.io/network-unavailable": ("NetworkUnavailable", "True"),
}
"""Taint key -> (condition type, the status under which the lifecycle controller keeps it);
the controller's ``nodeConditionToTaintKeyStatusMap``."""


def transient(taint: Taint) -> bool:
    """A taint the lifecycle controller adds and removes by itself (a node condition or the
    cordon), as opposed to one an operator or a provisioner set and keeps."""
    return taint.key in CONDITION_TAINTS or taint.key == UNSCHEDULABLE


def effective_taints(
    taints: Iterable[Taint], conditions: Mapping[str, str], *, unschedulable: bool = False
) -> tuple[Taint, ...]:
    """The node's taints as the scheduler will see them once the lifecycle controller has
    caught up with ``conditions`` (condition type -> status) and ``spec.unschedulable``.

    A condition taint whose condition is reported and fine is dropped (it is about to be
    removed); one whose condition is not reported is kept (nothing says it will go). A bad
    condition, or the cordon, adds its NoSchedule taint when the node does not carry it yet.
    """
    out: list[Taint] = []
    for t in taints:
        rule = CONDITION_TAINTS.get(t.key)
        if rule is not None:
            status = conditions.get(rule[0])
            if status is not None and status != rule[1]:
                continue
        elif t.key == UNSCHEDULABLE and not unschedulable:
            continue
        out.append(t)
    have = {(t.key, t.effect) for t in out}
    for key, (ctype, bad) in CONDITION_TAINTS.items():
        if conditions.get(ctype) == bad and (key, "NoSchedule") not in have:
            out.append(Taint(key, "", "NoSchedule"))
    if unschedulable and (UNSCHEDULABLE, "NoSchedule") not in have:
        out.append(Taint(UNSCHEDULABLE, "", "NoSchedule"))
    return tuple(out)


def lasting_taints(taints: tuple[Taint, ...]) -> tuple[Taint, ...]:
    """The taints a node keeps once it is healthy and not cordoned (``taints`` itself when
    it has no transient one, so shared tuples stay shared)."""
    if not any(transient(t) for t in taints):
        return taints
    return tuple(t for t in taints if not transient(t))
