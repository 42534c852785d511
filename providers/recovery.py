"""Orphan recovery: adopt what a live request owns, release what nobody owns any more.

A controller can die between a successful cloud call and the status write that records
its result. On restart (and periodically) it lists what each pool holds
(:meth:`Provider.list`, found by tags/labels) and compares it with the acquisition keys it
still considers live:

* nodes under a live key, as many as expected -> **adopt** (the caller records them; a
  repeated ``acquire`` with the same key would also return them without creating any);
* nodes under a key nobody owns, or an incomplete set under a live key -> **release**, but
  only once the key has been seen in that state for ``grace_seconds``. The grace period
  covers the window between a cloud call and the status write of an acquisition that is
  still running, and eventually consistent list APIs.

:func:`plan_recovery` is the pure decision; :class:`RecoveryRunner` runs it against a
provider and remembers when each orphan key was first seen. That memory is in-process: a
restart starts the grace period again, which delays a release but never hastens one.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from controller.api.capacitypool import CapacityPool
from providers.base import ProvidedNode, Provider, ProviderError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    adopt: Mapping[str, tuple[ProvidedNode, ...]]
    """Live key -> its nodes, complete: the caller records them as acquired."""
    release: tuple[str, ...]
    """Keys whose nodes must be released now (grace period over)."""
    waiting: Mapping[str, float]
    """Keys that will be released unless they become live: key -> seconds left."""
    first_seen: Mapping[str, float]
    """Updated memory for the next call: when each pending key was first seen."""
    reasons: Mapping[str, str] = field(default_factory=dict)
    """Key -> why it is released or waiting (for logs and events)."""


def plan_recovery(
    nodes: Iterable[ProvidedNode],
    live: Mapping[str, int | None],
    *,
    first_seen: Mapping[str, float],
    now: float,
    grace_seconds: float,
) -> RecoveryPlan:
    """Decide, per acquisition key found in ``nodes``, adopt / release / wait.

    ``live`` maps each key the controller still owns to the node count it expects
    (``None``: any count is fine, e.g. when the caller does not know it).
    """
    if grace_seconds < 0:
        raise ValueError("grace_seconds must be >= 0")
    by_key: dict[str, list[ProvidedNode]] = defaultdict(list)
    for node in nodes:
        by_key[node.key].append(node)

    adopt: dict[str, tuple[ProvidedNode, ...]] = {}
    release: list[str] = []
    waiting: dict[str, float] = {}
    seen: dict[str, float] = {}
    reasons: dict[str, str] = {}
    for key in sorted(by_key):
        found = sorted(by_key[key], key=lambda n: n.name)
        if key in live:
            expected = live[key]
            if expected is None or len(found) == expected:
                adopt[key] = tuple(found)
                continue
            reasons[key] = f"live request expects {expected} nodes, found {len(found)}"
        else:
            reasons[key] = "no live request owns this key"
        since = first_seen.get(key, now)
        left = grace_seconds - (now - since)
        if left <= 0:
            release.append(key)
        else:
            waiting[key] = left
            seen[key] = since
    return RecoveryPlan(
        adopt=adopt,
        release=tuple(release),
        waiting=waiting,
        first_seen=seen,
        reasons=reasons,
    )


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    plan: RecoveryPlan
    released: Mapping[str, int]
    """Key -> nodes the provider reported deleted."""
    failed: Mapping[str, str]
    """Key -> error of a release that failed (retried on the next sweep)."""


class RecoveryRunner:
    """Sweeps pools with :func:`plan_recovery`; one instance per controller process."""

    def __init__(
        self,
        provider: Provider,
        *,
        grace_seconds: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if grace_seconds < 0:
            raise ValueError("grace_seconds must be >= 0")
        self.provider = provider
        self.grace_seconds = grace_seconds
        self._clock = clock
        self._first_seen: dict[str, dict[str, float]] = {}
        # Keys whose release failed: retried even when list() no longer shows them, since
        # a release can fail after its instances are gone (e.g. a placement group still
        # in use while they terminate).
        self._unfinished: dict[str, set[str]] = {}

    async def sweep(self, pool: CapacityPool, live: Mapping[str, int | None]) -> RecoveryResult:
        """List ``pool``, adopt/release per the plan; release failures are reported, not
        raised, so one stuck key does not block the others."""
        nodes = await self.provider.list(pool)
        name = pool.metadata.name
        now = self._clock()
        plan = plan_recovery(
            nodes,
            live,
            first_seen=self._first_seen.get(name, {}),
            now=now,
            grace_seconds=self.grace_seconds,
        )
        released: dict[str, int] = {}
        failed: dict[str, str] = {}
        pending = dict(plan.first_seen)
        unfinished = self._unfinished.setdefault(name, set())
        retry = sorted(unfinished - set(live) - set(plan.release) - set(plan.waiting))
        for key in [*plan.release, *retry]:
            try:
                released[key] = await self.provider.release(pool, key)
                unfinished.discard(key)
                log.info("pool %s: released %d orphan nodes of key %s (%s)",
                         name, released[key], key, plan.reasons.get(key, "retry"))
            except ProviderError as exc:
                failed[key] = str(exc)
                unfinished.add(key)
                # Keep the key's age so that, if still listed, the next sweep retries at once.
                pending[key] = now - self.grace_seconds
                log.warning("pool %s: releasing orphan key %s failed: %s", name, key, exc)
        unfinished.intersection_update(failed)
        self._first_seen[name] = pending
        return RecoveryResult(plan=plan, released=released, failed=failed)
