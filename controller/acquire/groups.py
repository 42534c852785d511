"""All-or-nothing acquisition across a plan's groups.

Each (pool, domain) group is one provider call under its idempotency key; the groups run
concurrently. If any group fails, or returns fewer nodes than asked, every group of the
attempt is released (including the failed one: a provider's own rollback may have been cut
short) before :class:`AcquisitionFailed` is raised. The caller must have persisted the keys
on the request before calling :func:`acquire_all`, so a crash here leaves keys a restarted
controller can find.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from controller.api.capacitypool import CapacityPool
from controller.common.decision_log import log_decision
from controller.common.problem_log import ProblemLog
from controller.state.bookings import Group
from controller.state.ledger import BookingLedger
from providers.base import (
    AcquireRequest,
    CapacityUnavailable,
    ProvidedNode,
    Provider,
    ProviderError,
)

log = logging.getLogger(__name__)
_problems = ProblemLog(log)
"""A provider refusing releases is retried by the collector every interval: said once per
pool per interval, with the count, not once per key and attempt."""

ProviderFor = Callable[[CapacityPool], Provider]


class AcquisitionFailed(Exception):
    """The attempt acquired nothing it keeps; ``retryable`` says whether a later attempt may
    succeed (stock-outs, throttling) or not (quota, bad pool parameters)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        reason: str,
        short: Sequence[tuple[Group, int]] = (),
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.reason = reason
        self.short = tuple(short)
        """Groups the provider had no stock for, with how many nodes it could give there."""


async def acquire_all(
    groups: Sequence[Group],
    *,
    owner: str,
    owner_uid: str,
    pools: Mapping[str, CapacityPool],
    provider_for: ProviderFor,
    ledger: BookingLedger | None = None,
) -> dict[str, list[ProvidedNode]]:
    """Acquire every group or none; return what the provider launched by key, sorted by
    node name (``ledger``: see :func:`release_groups`)."""
    missing = sorted({g.pool for g in groups} - set(pools))
    if missing:
        raise AcquisitionFailed(
            f"CapacityPool(s) {', '.join(missing)} no longer exist", retryable=True,
            reason="PoolGone",
        )
    # Every pool's parameters are checked before any provider call, so a bad pool fails the
    # attempt (not retryable) without a node launched anywhere; the providers' own acquire
    # would find some problems only after launching other groups, or never (kind's).
    for name in sorted({g.pool for g in groups}):
        try:
            await provider_for(pools[name]).validate(pools[name])
        except ProviderError as exc:
            raise AcquisitionFailed(str(exc), retryable=exc.retryable,
                                    reason=str(exc.reason)) from None
    results = await asyncio.gather(
        *(_acquire_group(g, pools[g.pool], provider_for, owner, owner_uid) for g in groups),
        return_exceptions=True,
    )
    failures: list[BaseException] = []
    short: list[tuple[Group, int]] = []
    acquired: dict[str, list[ProvidedNode]] = {}
    for group, result in zip(groups, results, strict=True):
        if isinstance(result, BaseException):
            failures.append(result)
            if isinstance(result, CapacityUnavailable):
                short.append((group, result.available or 0))
        elif len(result) != group.count:
            failures.append(
                ProviderError(
                    f"pool {group.pool} returned {len(result)} of {group.count} node(s)"
                )
            )
        else:
            acquired[group.key] = result
    if not failures:
        return acquired
    await release_groups(groups, pools=pools, provider_for=provider_for, owner=owner,
                         why="rolling back the failed acquisition (all or nothing)",
                         ledger=ledger)
    first = failures[0]
    if isinstance(first, asyncio.CancelledError):
        raise first
    retryable = all(getattr(f, "retryable", True) for f in failures)
    reason = getattr(first, "reason", type(first).__name__)
    raise AcquisitionFailed(
        "; ".join(str(f) or type(f).__name__ for f in failures),
        retryable=retryable,
        reason=str(reason),
        short=short,
    )


async def _acquire_group(
    group: Group, pool: CapacityPool, provider_for: ProviderFor, owner: str, owner_uid: str
) -> list[ProvidedNode]:
    provider = provider_for(pool)
    nodes = await provider.acquire(
        AcquireRequest(
            key=group.key,
            pool=pool,
            count=group.count,
            domain=dict(group.domain),
            owner=owner,
            owner_uid=owner_uid,
        )
    )
    return sorted(nodes, key=lambda n: n.name)


async def release_groups(
    groups: Sequence[Group],
    *,
    pools: Mapping[str, CapacityPool],
    provider_for: ProviderFor,
    owner: str = "",
    why: str = "",
    ledger: BookingLedger | None = None,
) -> int:
    """Release every group (idempotent); return how many nodes were deleted. Each group
    that deleted nodes is one ``release`` decision line naming ``owner`` and ``why``.

    Errors are logged and the remaining groups still released; the orphan collector retries
    whatever is left. ``ledger`` (the cache's) holds the groups' keys as being released
    while their nodes are being deleted, from before the first await, and as released after,
    until the cache has seen the nodes go: the planner offers those nodes to nobody (a
    request booked on them meanwhile would be left with nodes that vanish).
    """
    keys = {g.key for g in groups}
    mine = ledger.start_release(keys) if ledger is not None else frozenset()
    try:
        return await _release(groups, pools=pools, provider_for=provider_for, owner=owner,
                              why=why)
    finally:
        if ledger is not None:
            ledger.end_release(mine, released=keys)


async def _release(
    groups: Sequence[Group], *, pools: Mapping[str, CapacityPool], provider_for: ProviderFor,
    owner: str, why: str,
) -> int:
    async def one(group: Group) -> int:
        pool = pools.get(group.pool)
        if pool is None:
            _problems.warning(f"release {group.pool} gone",
                              "cannot release %s: CapacityPool %s is gone", group.key, group.pool)
            return 0
        try:
            count = await provider_for(pool).release(pool, group.key)
        except ProviderError as exc:
            # The collector retries every interval: said once per pool per interval.
            _problems.warning(f"release {group.pool}", "releasing %s in pool %s failed: %s; "
                              "the collector retries", group.key, group.pool, exc)
            return 0
        _problems.resolved(f"release {group.pool}", "releases in pool %s succeed again",
                           group.pool)
        if count:
            log_decision("release", owner or "-", outcome="released", pool=group.pool,
                   key=group.key, nodes=count, why=why)
        return count

    counts: Sequence[int] = await asyncio.gather(*(one(g) for g in groups))
    return sum(counts)
