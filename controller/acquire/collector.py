"""The orphan and idle collector: releases provider nodes no booking protects.

Runs at start-up (after the cache has synced, before new acquisitions) and then
periodically. It asks every pool's provider what exists (:meth:`Provider.list`), groups the
nodes by acquisition key, and releases a group when:

* its owner request is gone, failed, or recorded other keys (an interrupted earlier attempt:
  the leak a crash mid-acquisition would leave), and no pod runs on it, or
* its owner's booking ended (consumed, expired, revoked) and its nodes have had no pods for
  ``idle_ttl`` seconds: a gang's nodes are released together, never one by one.

Groups of an active booking, with an acquisition in flight in this process, or with a node
any live booking counts on (another request booked on nodes this one acquired), are never
touched. A pool being deleted (its finalizer holds it, :mod:`controller.reconcilers.pools`)
gets no new nodes and no new plans; each of its groups is released as soon as no booking
holds it and no pod runs on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

from controller.acquire.atomic import release_groups
from controller.acquire.providers import ProviderSet
from controller.kube.problems import ProblemLog
from controller.state.bookings import (
    PHASE_ANNOTATION,
    PLAN_ANNOTATION,
    Booking,
    Group,
    Phase,
)
from controller.state.cache import ClusterState
from providers.base import ProvidedNode, ProviderError

log = logging.getLogger(__name__)
_problems = ProblemLog(log)


@dataclass(frozen=True, slots=True)
class Released:
    key: str
    pool: str
    nodes: int
    why: str


class Collector:
    def __init__(
        self,
        *,
        state: ClusterState,
        providers: ProviderSet,
        idle_ttl: float,
        now: Callable[[], datetime],
        in_flight: Callable[[], Collection[str]],
    ) -> None:
        self._state = state
        self._providers = providers
        self._idle_ttl = idle_ttl
        self._now = now
        self._in_flight = in_flight
        self._idle_since: dict[str, datetime] = {}
        self._seen_used: set[str] = set()

    async def run_once(self) -> list[Released]:
        self._state.prune_vanished()
        owners = self._owners()
        released: list[Released] = []
        pools = dict(self._state.pools())
        for pool in pools.values():
            try:
                provided = await self._providers.for_pool(pool).list(pool)
            except ProviderError as exc:
                _problems.warning(f"list {pool.metadata.name}", "listing pool %s failed: %s",
                                  pool.metadata.name, exc)
                continue
            _problems.resolved(f"list {pool.metadata.name}")
            deleting = self._state.pool_deleting(pool.metadata.name)
            for key, nodes in _by_key(provided).items():
                # Bookings made while the provider listed or the last group was released.
                booked = self._state.booked_nodes()
                if any(n.name in booked for n in nodes):
                    self._idle_since.pop(key, None)
                    continue
                why = self._verdict(key, nodes, owners, pool_deleting=deleting)
                if why is None:
                    continue
                group = Group(key=key, pool=pool.metadata.name, domain={}, count=len(nodes))
                count = await release_groups(
                    [group], pools=pools, provider_for=self._providers.for_pool,
                    releasing=self._state.releasing,
                )
                if not count and any(self._state.node_exists(n.name) for n in nodes):
                    continue  # the release failed (said once per interval): next time
                self._idle_since.pop(key, None)
                self._seen_used.discard(key)
                released.append(Released(key, pool.metadata.name, count, why))
                log.info("released %d node(s) of %s in pool %s: %s", count, key,
                         pool.metadata.name, why)
        return released

    def _owners(self) -> dict[str, tuple[Phase, frozenset[str]]]:
        """Request uid -> (phase, keys its booking records)."""
        out: dict[str, tuple[Phase, frozenset[str]]] = {}
        for body in self._state.requests().values():
            meta = body.get("metadata") or {}
            annotations = meta.get("annotations") or {}
            try:
                phase = Phase(annotations.get(PHASE_ANNOTATION, ""))
            except ValueError:
                phase = Phase.NEW
            keys: frozenset[str] = frozenset()
            text = annotations.get(PLAN_ANNOTATION)
            if text:
                try:
                    keys = frozenset(g.key for g in Booking.from_annotation(text).groups)
                except ValueError:
                    keys = frozenset()
            if meta.get("deletionTimestamp"):
                phase = Phase.ENDED
            out[str(meta.get("uid"))] = (phase, keys)
        for key, booking in self._state.bookings().items():
            found = self._state.request(key)
            if found is not None:
                uid = str(found["metadata"].get("uid"))
                phase, keys = out.get(uid, (Phase.ACQUIRING, frozenset()))
                out[uid] = (phase, keys | {g.key for g in booking.groups})
        return out

    def _verdict(
        self,
        key: str,
        nodes: list[ProvidedNode],
        owners: dict[str, tuple[Phase, frozenset[str]]],
        *,
        pool_deleting: bool = False,
    ) -> str | None:
        """Why the group must go now, or None to keep it."""
        if key in self._in_flight():
            return None
        owner = owners.get(nodes[0].owner_uid) if nodes[0].owner_uid else None
        current = owner is not None and key in owner[1]
        if current and owner is not None and owner[0] in (Phase.ACQUIRING, Phase.BOOKED):
            self._idle_since.pop(key, None)
            return None
        if any(self._state.pods_on(n.name) > 0 for n in nodes):
            self._seen_used.add(key)
            self._idle_since.pop(key, None)
            return None
        if pool_deleting:
            # Nothing new is planned on these nodes: waiting out the idle TTL buys nothing.
            return "its CapacityPool is being deleted and no booking or pod uses it"
        ended_in_use = current and owner is not None and owner[0] is Phase.ENDED
        if key not in self._seen_used and not ended_in_use:
            if owner is None:
                return "its request is gone and no pod ever ran on it"
            return "no booking holds it (an interrupted or failed attempt) and it is unused"
        since = self._idle_since.setdefault(key, self._now())
        idle = (self._now() - since).total_seconds()
        if idle >= self._idle_ttl:
            return f"its pods are gone and it was idle for {idle:.0f}s"
        return None


def _by_key(nodes: list[ProvidedNode]) -> dict[str, list[ProvidedNode]]:
    out: dict[str, list[ProvidedNode]] = {}
    for node in nodes:
        if node.key:
            out.setdefault(node.key, []).append(node)
    return out
