"""Topology relaxation: a gang that waited long enough for its required domain takes the most
compact placement it can get. Pure (no I/O, no clock: times are passed in).

A pod set whose PodTemplate carries Muster's ``muster.dev/required-topology: <level>`` asks for
one domain of that level. Under scarcity such a domain can stay unavailable for hours while
the same GPUs, spread over two racks, are free. The request's policy says how long it waits:

* the ``relaxTopologyAfter`` parameter (Kueue passes it through from a
  ProvisioningRequestConfig's ``spec.parameters`` or a Job's
  ``provreq.kueue.x-k8s.io/relaxTopologyAfter`` annotation, paths A and B alike), else
* the request's ``muster.dev/relax-topology-after`` annotation, else
* the ``spec.relaxTopologyAfter`` of the CapacityPools the gang may use (:func:`pools_default`:
  the longest of their waits, a pool without one counting as the global default), else
* the controller's ``topology.relax_after_seconds`` (null: never).

Once the wait (from the request's creation) is over, the planner tries, in one pass and in this
order, the strict gang, the gang with every relaxable pod set required in one domain of each
wider level in turn (one block before two), then the gang with those pod sets ``preferred``
at their level (fewest domains, climbing as Kueue TAS's preferred does). The first that fits
wins; the placement is named in ``provisioningClassDetails`` and the Provisioned message.

Kueue's own TAS annotations keep their meaning: ``kueue.x-k8s.io/podset-required-topology`` is
never relaxed (Kueue assigns the pods' topology itself after provisioning and would not admit
them elsewhere), and ``podset-preferred-topology`` is already the most compact placement.
Required placement that comes from pod affinity is never relaxed either.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from controller.api.capacitypool import CapacityPool
from controller.api.parameters import RELAX_TOPOLOGY_AFTER, duration_seconds
from controller.common.topology_defaults import KUEUE_REQUIRED, MUSTER_REQUIRED, POOL_LABEL
from controller.fit.shapes import selector_matches, untolerated
from controller.fit.types import GangRequest, Plan, Taint, TopologyMode, TopologyRequest
from controller.inputs.node_labels import node_labels

RELAX_ANNOTATION = "muster.dev/relax-topology-after"
RELAXED_DETAIL = "muster.dev/topology-relaxed"
"""``provisioningClassDetails`` key naming each relaxed pod set's placement."""


def relax_after(
    parameter: float | None, annotations: Mapping[str, str], default: float | None
) -> float | None:
    """Seconds the request waits for its required domains (None: it never relaxes); the
    parameter (already read) first, then the annotation, then the configured default.
    Raises ValueError naming an unreadable annotation."""
    if parameter is not None:
        seconds: float | None = parameter
    elif RELAX_ANNOTATION in annotations:
        seconds = duration_seconds(annotations[RELAX_ANNOTATION])
        if seconds is None:
            raise ValueError(
                f"metadata.annotations[{RELAX_ANNOTATION}] must be a duration such as 30m, "
                f"1h30m, 90s or 0, or never, got {annotations[RELAX_ANNOTATION]!r} (the "
                f"{RELAX_TOPOLOGY_AFTER} parameter takes the same values)"
            )
    else:
        seconds = default
    if seconds is None or seconds == float("inf"):
        return None
    return seconds


def pools_default(
    gang: GangRequest, sets: Mapping[str, str], pools: Iterable[CapacityPool],
    default: float | None,
) -> float | None:
    """The default wait of the relaxable pod sets ``sets`` of ``gang`` (seconds; None:
    never): the longest ``spec.relaxTopologyAfter`` of the pools those pod sets may use
    (their node template's labels match the pods' selectors and its taints are tolerated),
    a pool without one counting as ``default`` (the global setting). A relaxed placement may
    land on any of those pools, so a pool that asks for a longer wait, or for strict
    placement, is never overridden by another. ``default`` when none of them sets one."""
    shapes = [ps.shape for ps in gang.pod_sets if ps.name in sets]
    fallback = math.inf if default is None else default
    waits: list[float] = []
    any_set = False
    for pool in pools:
        spec = pool.spec
        template = spec.node_template
        labels = {**node_labels(template.labels, parameters=spec.parameters),
                  POOL_LABEL: pool.metadata.name}
        taints = tuple(Taint(t.key, t.value, t.effect) for t in template.taints)
        if not any(selector_matches(shape, labels, None)
                   and not untolerated(taints, shape.tolerations) for shape in shapes):
            continue
        own = spec.relax_after_seconds
        any_set = any_set or own is not None
        waits.append(fallback if own is None else own)
    if not any_set:
        return default
    longest = max(waits)
    return None if longest == math.inf else longest


def relax_at(created: datetime | None, seconds: float | None) -> datetime | None:
    """When a request created at ``created`` relaxes (None: never)."""
    if created is None or seconds is None:
        return None
    return created + timedelta(seconds=seconds)


def hold_until(
    relax_time: datetime | None, now: datetime, reserve_seconds: float | None
) -> datetime | None:
    """Until when a gang whose wait ended at ``relax_time`` holds a reservation against
    younger requests (``topology.reserve_seconds``), or None (off, or still waiting)."""
    if relax_time is None or reserve_seconds is None or now < relax_time:
        return None
    return relax_time + timedelta(seconds=reserve_seconds)


def relaxable(
    gang: GangRequest, annotations: Sequence[Mapping[str, str]], levels: Sequence[str]
) -> dict[str, str]:
    """Pod set name -> level, for the pod sets of ``gang`` that Muster may relax:
    ``annotations[i]`` are the PodTemplate annotations of pod set ``i``. Only Muster's
    required annotation, with no Kueue required annotation beside it, and only when the pod
    set's requirement is still that one (pod affinity did not impose another)."""
    out: dict[str, str] = {}
    for pod_set, notes in zip(gang.pod_sets, annotations, strict=False):
        asked = notes.get(MUSTER_REQUIRED)
        if not asked or notes.get(KUEUE_REQUIRED):
            continue
        # As controller.inputs.snapshot reads it: a full label key, or its last segment ("rack").
        short = [lv for lv in levels if lv.rsplit("/", 1)[-1] == asked]
        level = asked if asked in levels or len(short) != 1 else short[0]
        topo = pod_set.topology
        if topo.mode is TopologyMode.REQUIRED and topo.level == level:
            out[pod_set.name] = level
    return out


def alternatives(
    gang: GangRequest, sets: Mapping[str, str], levels: Sequence[str]
) -> tuple[GangRequest, ...]:
    """The relaxed gangs to try after the strict one, most compact first: every relaxable
    pod set required in one domain of each wider level in turn, then preferred at its own
    level (fewest domains)."""
    if not sets:
        return ()
    out: list[GangRequest] = []
    deepest = max(levels.index(level) for level in sets.values())
    for index in range(deepest - 1, -1, -1):

        def wider(topo: TopologyRequest, index: int = index) -> TopologyRequest:
            own = levels.index(topo.level) if topo.level in levels else index
            return replace(topo, level=levels[min(own, index)])

        out.append(_with(gang, sets, wider))
    out.append(_with(gang, sets, lambda topo: replace(topo, mode=TopologyMode.PREFERRED)))
    return tuple(out)


def _with(
    gang: GangRequest, sets: Mapping[str, str], change: Callable[[TopologyRequest], TopologyRequest]
) -> GangRequest:
    return replace(
        gang,
        pod_sets=tuple(
            replace(ps, topology=change(ps.topology)) if ps.name in sets else ps
            for ps in gang.pod_sets
        ),
    )


def relaxed_placements(plan: Plan, sets: Mapping[str, str]) -> dict[str, str]:
    """Pod set -> where it went, for the pod sets of ``sets`` (name -> required level) that
    ``plan`` does not keep in one domain of their level: the relaxed ones."""
    out: dict[str, str] = {}
    for p in plan.placements:
        level = sets.get(p.pod_set)
        if level is None or (p.level == level and p.domain is not None):
            continue
        out[p.pod_set] = _placement_text(p.level, p.domain, p.domains_used)
    return out


def _placement_text(level: str | None, domain: str | None, used: int) -> str:
    short = (level or "domain").rsplit("/", 1)[-1]
    if domain is not None:
        return f"one {short} {domain}"
    return f"{used} {short}s"


def describe(relaxed: Mapping[str, str], sets: Mapping[str, str], waited: float | None) -> str:
    """One sentence for the Provisioned message."""
    parts = [
        f"pod set {name} in {where} instead of one {sets[name].rsplit('/', 1)[-1]}"
        for name, where in sorted(relaxed.items())
    ]
    after = f" after waiting {waited:.0f}s" if waited is not None else ""
    return f"Topology relaxed{after} ({RELAX_TOPOLOGY_AFTER}): {'; '.join(parts)}."


def detail(relaxed: Mapping[str, str]) -> str:
    """The ``muster.dev/topology-relaxed`` value: ``<pod set>=<where>`` joined by commas."""
    return ",".join(f"{name}={where}" for name, where in sorted(relaxed.items()))
