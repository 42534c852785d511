"""CapacityPool finalizer: a pool is not gone until the nodes Muster acquired through it are.

A provider releases nodes with the pool's own settings (region, project, instance
parameters), so a pool deleted while it still had nodes would leave them running for good,
heartbeated and even planned on by later requests. Muster therefore holds every pool it
serves with the ``muster.dev/release-nodes`` finalizer, added when the pool appears and, at
the latest, before any node is acquired through it (:func:`hold_pools`), so no node is ever
acquired through a pool that could vanish without waiting for it. When a pool is deleted,
the cache
stops planning on it (:meth:`PoolRegistry.deleting`), :func:`hold_pools` refuses new
acquisitions through it, the collector releases each of its node groups once no booking and
no pod uses it, and this reconciler removes the finalizer when no node of the pool is left
and no acquisition through it still runs (its nodes may not have reached the cache yet), and
no request of a queued class still waits in the pool's cloud queue (the request cancels its
queued request through the pool, then fails ``CapacityPoolDeleted``:
:mod:`controller.reconcilers.queued`).
"No node left" is asked of the cloud too: a machine that booted but has not registered (or
never will) is a Node nobody labelled with the pool, yet it is billed and only the pool's
settings can release it; the collector releases it, and the finalizer waits for that.

Finalizer writes carry the pool's resourceVersion, so another controller's finalizer is
never dropped (a 409 is retried on the next pass).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from controller.acquire.providers import ProviderSet
from controller.api.capacitypool import POOL_FINALIZER, CapacityPool
from controller.common.problem_log import ProblemLog
from controller.common.topology_defaults import POOL_LABEL
from controller.config import ClassesConfig
from controller.kube import ApiError, KubeClient
from controller.kube.resources import CAPACITY_POOLS, NODES
from controller.reconcilers.queued import waiting_pools
from controller.state.cache import ClusterState
from providers.base import ProviderConfigError, ProviderError

log = logging.getLogger(__name__)
_problems = ProblemLog(log)

async def sync_pool_finalizers(kube: KubeClient, state: ClusterState, providers: ProviderSet,
                               classes: ClassesConfig,
                               wake: Callable[[str], None] | None = None) -> None:
    """Add the finalizer to live pools; remove it from deleted pools with no node left
    (registered or not) and no request of a queued class (``classes``) still waiting in
    their cloud queue. Such requests are handed to ``wake`` (the work queue), so they cancel
    and let the pool go."""
    queued = waiting_pools(state, classes)
    for name, pool in list(state.pool_registry.pools().items()):
        finalizers = pool.metadata.finalizers
        held = POOL_FINALIZER in finalizers
        if state.pool_registry.deleting(name):
            if held and wake is not None:
                for key in queued.get(name, ()):
                    wake(key)
            if not held or state.pool_in_use(name) or name in queued:
                continue
            # The cache can lag the nodes an acquisition just created; ask the API server
            # once before the pool's provider settings go for good.
            left = await kube.list(NODES, label_selector=f"{POOL_LABEL}={name}")
            if left.get("items") or await _cloud_holds(providers, pool):
                continue
            wanted = [f for f in finalizers if f != POOL_FINALIZER]
            log.info("CapacityPool %s: its last node is released; letting it go", name)
        elif held:
            continue
        else:
            wanted = [*finalizers, POOL_FINALIZER]
        await _write_finalizers(kube, pool, wanted)


async def hold_pools(kube: KubeClient, names: set[str]) -> None:
    """Make sure each pool carries the finalizer before anything is acquired through it
    (read fresh, written under its resourceVersion; a 409 reads again). Raises ApiError when
    a pool is gone or keeps changing: the acquisition is then retried like any API error."""
    for name in sorted(names):
        for attempt in range(3):
            body = await kube.get(CAPACITY_POOLS, name)
            meta = body.get("metadata") or {}
            finalizers = list(meta.get("finalizers") or [])
            # A deleting pool takes no new node even while the finalizer still holds it
            # (the watch that stops planning on it may lag this read).
            if meta.get("deletionTimestamp"):
                raise ApiError(409, "Conflict", f"CapacityPool {name} is being deleted")
            if POOL_FINALIZER in finalizers:
                break
            patch = {"metadata": {"finalizers": [*finalizers, POOL_FINALIZER],
                                  "resourceVersion": meta.get("resourceVersion")}}
            try:
                await kube.merge_patch(CAPACITY_POOLS, name, patch)
                break
            except ApiError as exc:
                if not exc.conflict or attempt == 2:
                    raise


async def _cloud_holds(providers: ProviderSet, pool: CapacityPool) -> bool:
    """The pool's provider still lists a machine of it, or cannot answer now: the finalizer
    stays. A provider that cannot be set up at all for the pool (no credentials, a bad
    parameter: :class:`ProviderConfigError`) launched nothing with this configuration and
    can release nothing either; holding the pool for it would only block its deletion for
    good, so the pool goes (said once)."""
    name = pool.metadata.name
    try:
        held = await providers.for_pool(pool).list(pool)
    except ProviderConfigError as exc:
        _problems.warning(f"deleting {name}", "CapacityPool %s is being deleted and its "
                          "provider cannot be set up to list its machines (%s); letting it go "
                          "with no registered node left", name, exc)
        return False
    except ProviderError as exc:
        _problems.warning(f"deleting {name}", "CapacityPool %s is being deleted but its "
                          "provider cannot list its machines now (%s); keeping it until it "
                          "can", name, exc)
        return True
    _problems.resolved(f"deleting {name}")
    if held:
        _problems.warning(f"waiting {name}", "CapacityPool %s is being deleted: waiting for "
                          "%d machine(s) its provider still holds (%s) to be released", name,
                          len(held), ", ".join(sorted(n.name for n in held)[:5]))
    else:
        _problems.resolved(f"waiting {name}")
    return bool(held)


async def _write_finalizers(kube: KubeClient, pool: CapacityPool, wanted: list[str]) -> None:
    patch = {"metadata": {"finalizers": wanted,
                          "resourceVersion": pool.metadata.resource_version}}
    try:
        await kube.merge_patch(CAPACITY_POOLS, pool.metadata.name, patch)
    except ApiError as exc:
        if exc.conflict or exc.not_found:
            return  # changed or gone meanwhile: the watch brings the news, next pass redoes
        raise
