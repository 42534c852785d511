"""The orphan and idle collector: releases provider nodes no booking protects.

Runs at start-up (after the cache has synced, before new acquisitions) and then
periodically. It asks every pool's provider what exists (:meth:`Provider.list`), groups the
nodes by acquisition key, and asks :func:`controller.acquire.recovery.decide` about each
group: an orphan (an interrupted or failed attempt, or a request that is gone) is released
once it has been seen unheld for ``acquisition.orphan_grace_seconds``; a gang whose pods are
gone, or whose booking ended, once idle for ``acquisition.idle_ttl_seconds``. Groups of an
active booking, with an acquisition in flight in this process, or with a node any live
booking counts on, are never touched. A pool being deleted (its finalizer holds it,
:mod:`controller.reconcilers.pools`) gets no new nodes and no new plans; its used groups go as
soon as no booking holds them and no pod runs on them.

A release that fails (a provider error) is retried at the next sweep, even when the pool no
longer lists the key: a release can fail after its machines are gone (an AWS placement group
still in use while its instances terminate) and must still be finished.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from controller.acquire.providers import ProviderSet
from controller.acquire.recovery import GroupView, Seen, decide
from controller.api.capacitypool import CapacityPool
from controller.common.decision_log import log_decision
from controller.common.problem_log import ProblemLog
from controller.lifecycle import Phase
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
        grace: float,
        now: Callable[[], datetime],
        in_flight: Callable[[str], bool],
    ) -> None:
        self._state = state
        self._providers = providers
        self._idle_ttl = idle_ttl
        self._grace = grace
        self._now = now
        self._in_flight = in_flight
        """Whether an acquisition under a key runs in this process now (asked at each
        group, so one started while the providers are listed counts)."""
        self._seen: dict[str, Seen] = {}
        self._unfinished: dict[str, str] = {}
        """Key -> pool of a release that failed: retried until it succeeds."""
        self._list_errors: dict[str, str] = {}
        """Pool -> why listing it failed last pass (logged once per change, not per pass;
        the pool's ProviderReady condition carries it meanwhile)."""

    async def run_once(self) -> list[Released]:
        self._state.prune_vanished(self._now())
        owners = self._owners()
        released: list[Released] = []
        pools = dict(self._state.pool_registry.pools())
        listed: set[str] = set()
        complete = True
        for pool in pools.values():
            provided = await self._list(pool)
            if provided is None:
                complete = False
                continue
            deleting = self._state.pool_registry.deleting(pool.metadata.name)
            for key, nodes in _by_key(provided).items():
                listed.add(key)
                owner = owners.get(nodes[0].owner_uid) if nodes[0].owner_uid else None
                # Bookings made while the provider listed or the last group was released.
                booked = self._state.booked_nodes()
                booked_ids = self._state.booked_provider_ids()
                # A machine's Node is known by its providerID; the provider's name is a hint
                # (a kubelet may register under another name).
                names = [self._node_name(n) for n in nodes]
                view = GroupView(
                    in_flight=self._in_flight(key),
                    booked=any(n in booked for n in names)
                    or any(n.provider_id in booked_ids for n in nodes),
                    owner_known=owner is not None,
                    holder=owner[0] if owner is not None and key in owner[1] else None,
                    in_use=any(self._state.objects.pods_on(n) > 0 for n in names),
                    pool_deleting=deleting,
                )
                seen = self._seen.get(key, Seen())
                decision = decide(view, seen, now=self._now(),
                                  grace=self._grace, idle_ttl=self._idle_ttl)
                self._seen[key] = decision.seen
                if decision.release:
                    done = await self._release(pool, key, decision.why,
                                               owner=nodes[0].owner)
                    if done is not None:
                        released.append(done)
                    else:
                        # Refused: it stays due, so the next sweep tries again rather
                        # than waiting out the grace or idle TTL once more.
                        self._seen[key] = seen
        for key, pool_name in sorted(self._unfinished.items()):
            unfinished = pools.get(pool_name)
            if key not in listed and unfinished is not None:
                done = await self._release(unfinished, key, "retrying a release that failed")
                if done is not None:
                    released.append(done)
        if complete:  # forget groups that are gone (a failed listing may hide live ones)
            for key in set(self._seen) - listed:
                del self._seen[key]
        return released

    def _node_name(self, node: ProvidedNode) -> str:
        """The name ``node`` registered under (found by providerID), else the provider's."""
        found = (self._state.objects.node_by_provider_id(node.provider_id)
                 if node.provider_id else None)
        return found.metadata.name if found is not None else node.name

    async def _list(self, pool: CapacityPool) -> list[ProvidedNode] | None:
        """The pool's nodes as its provider lists them; None (logged once per change of
        the error, not per pass) when it cannot."""
        name = pool.metadata.name
        try:
            provided = await self._providers.for_pool(pool).list(pool)
        except ProviderError as exc:
            if self._list_errors.get(name) != str(exc):
                log.warning("listing pool %s failed: %s (logged again only if this "
                            "changes; see its ProviderReady condition)", name, exc)
            self._list_errors[name] = str(exc)
            return None
        if self._list_errors.pop(name, None) is not None:
            log.info("listing pool %s works again", name)
        return provided

    async def _release(
        self, pool: CapacityPool, key: str, why: str, *, owner: str = ""
    ) -> Released | None:
        name = pool.metadata.name
        # Offered to no plan while its nodes are being deleted (the ledger's releases).
        mine = self._state.ledger.start_release((key,))
        try:
            count = await self._providers.for_pool(pool).release(pool, key)
        except ProviderError as exc:
            _problems.warning(f"release {name}", "releasing %s in pool %s failed (retried at "
                              "the next sweep): %s", key, name, exc)
            if key not in self._unfinished:  # a decision once, not one per sweep's retry
                log_decision("release", owner or "-", outcome="failed", pool=name, key=key,
                             error=str(exc), why=why)
            self._unfinished[key] = name
            return None
        finally:
            self._state.ledger.end_release(mine, released=(key,))
        _problems.resolved(f"release {name}")
        self._unfinished.pop(key, None)
        self._seen.pop(key, None)
        log_decision("release", owner or "-", outcome="released", pool=name, key=key,
                     nodes=count, why=why)
        return Released(key, name, count, why)

    def _owners(self) -> dict[str, tuple[Phase, frozenset[str]]]:
        """Request uid -> (phase, keys its booking records)."""
        out: dict[str, tuple[Phase, frozenset[str]]] = {}
        for record in self._state.objects.requests().values():
            booking = record.booking
            keys = frozenset(g.key for g in booking.groups) if booking else frozenset()
            phase = Phase.ENDED if record.deleting else record.annotated_phase
            out[record.uid] = (phase, keys)
        for key, booking in self._state.ledger.bookings().items():
            found = self._state.objects.request(key)
            if found is not None:
                uid = found.uid
                phase, keys = out.get(uid, (Phase.ACQUIRING, frozenset()))
                out[uid] = (phase, keys | {g.key for g in booking.groups})
        return out


def _by_key(nodes: list[ProvidedNode]) -> dict[str, list[ProvidedNode]]:
    out: dict[str, list[ProvidedNode]] = {}
    for node in nodes:
        if node.key:
            out.setdefault(node.key, []).append(node)
    return out
