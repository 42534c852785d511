"""List-then-watch loops that keep :class:`ClusterState` current.

One task per resource, each re-listing after a 410 Gone or a dropped stream (see
:meth:`controller.kube.KubeClient.watch`). ProvisioningRequests come the same way, and each
event of one enqueues its key for a reconcile: the controller's only event source
(docs/design/api-client.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from controller.kube import ApiError, KubeClient, Page, WatchEvent, whole_listing
from controller.kube.resources import (
    CAPACITY_POOLS,
    DEVICE_CLASSES,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Resource,
)
from controller.state.cache import ClusterState
from controller.state.object_store import Body, object_key

log = logging.getLogger(__name__)

class Feeds:
    def __init__(self, kube: KubeClient, state: ClusterState):
        self._kube = kube
        self._state = state
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for res, on_page, on_event in self._specs():
            self._tasks.append(
                asyncio.create_task(
                    self._kube.watch(res, on_page, on_event), name=f"watch-{res.plural}"
                )
            )
        for res in (RESOURCE_SLICES, RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES, DEVICE_CLASSES):
            self._tasks.append(
                asyncio.create_task(self._watch_dra(res), name=f"watch-{res.plural}")
            )

    async def list_once(self) -> None:
        """Fill the cache from one list of each kind, without watching: what a read-only
        client (``kubectl muster``) plans against, built by the controller's own code."""
        for res, on_page, _ in self._specs():
            async for page in self._kube.pages(res):
                on_page(page)
        for res in (RESOURCE_SLICES, RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES, DEVICE_CLASSES):
            try:
                listing = await self._kube.list(res)
            except ApiError as exc:
                if exc.not_found or exc.status == 403:
                    self._state.dra.synced[res.plural].set()
                    continue
                raise
            self._state.dra.replace(res.plural, listing.get("items") or [])

    def _specs(
        self,
    ) -> list[tuple[Resource, Callable[[Page], None], Callable[[WatchEvent], None]]]:
        s = self._state
        specs: list[tuple[Resource, Callable[[Page], None], Callable[[WatchEvent], None]]]
        specs = [
            (
                NODES,
                _paged(s, "nodes"),
                _events(s.upsert_node, lambda o: s.delete_node(object_key(o))),
            ),
            (PODS, _paged(s, "pods"),
             _events(s.upsert_pod, lambda o: s.delete_pod(object_key(o)))),
            (
                POD_TEMPLATES,
                _whole(s.replace_templates),
                _events(s.upsert_template, lambda o: s.delete_template(object_key(o))),
            ),
            (
                CAPACITY_POOLS,
                _whole(s.replace_pools),
                _events(s.upsert_pool, lambda o: s.delete_pool(object_key(o))),
            ),
            (
                PROVISIONING_REQUESTS,
                lambda page: _sync_requests(s, page),
                _events(
                    lambda o: _upsert_and_notify(s, o),
                    lambda o: s.delete_request(
                        object_key(o), uid=(o.get("metadata") or {}).get("uid")),
                ),
            ),
        ]
        return specs

    async def _watch_dra(self, res: Resource) -> None:
        """Watch one DRA kind; an API server that does not serve resource.k8s.io/v1
        (Kubernetes < 1.34), or forbids reading it, means no devices: said once rather than
        retried forever."""
        try:
            await self._kube.list(res)
        except ApiError as exc:
            if exc.not_found or exc.status == 403:
                # Not served, or no RBAC rule for it: plan as if no node had devices.
                log.warning("cannot list %s (%s): planning without DRA devices", res.plural,
                            exc)
                self._state.dra.synced[res.plural].set()
                return
        dra, kind = self._state.dra, res.plural
        await self._kube.watch(
            res,
            _whole(lambda items: dra.replace(kind, items)),
            _events(lambda o: dra.upsert(kind, o), lambda o: dra.delete(kind, object_key(o))),
        )

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The watch tasks (for liveness: a dead watch leaves the cache stale)."""
        return list(self._tasks)

    def _sync_events(self) -> dict[str, asyncio.Event]:
        kinds = ["nodes", "pods", "podtemplates", "pools", "requests"]
        events = {k: self._state.synced[k] for k in kinds}
        events.update(self._state.dra.synced)
        return events

    async def wait_synced(self, within: float = 30.0) -> None:
        events = self._sync_events().values()
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), within)

    def unsynced(self) -> list[str]:
        """The caches still waiting for their first list."""
        return sorted(k for k, e in self._sync_events().items() if not e.is_set())

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _paged(state: ClusterState, kind: str) -> Callable[[Page], None]:
    """Pages of a large kind straight into the cache (nodes, pods: the bulk of a cluster)."""
    relist = state.relists[kind]
    return lambda page: relist.page(page.items, first=page.first, last=page.last)


def _whole(replace: Callable[[list[Body]], None]) -> Callable[[Page], None]:
    """A small kind's listing replaced at once (its replace resets derived state)."""
    on_page = whole_listing(replace)

    def handle(page: Page) -> None:
        on_page(page)

    return handle


def _sync_requests(state: ClusterState, page: Page) -> None:
    state.relists["requests"].page(page.items, first=page.first, last=page.last)
    if page.last:
        for key in list(state.objects.requests()):
            state.notify(key)


def _upsert_and_notify(state: ClusterState, obj: Body) -> None:
    state.upsert_request(obj)
    state.notify(object_key(obj))


def _events(
    upsert: Callable[[Body], object], delete: Callable[[Body], None]
) -> Callable[[WatchEvent], None]:
    def handle(event: WatchEvent) -> None:
        if event.type == "DELETED":
            delete(event.object)
        else:
            upsert(event.object)

    return handle
