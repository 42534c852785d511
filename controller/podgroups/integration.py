"""Native gangs: watches gang PodGroups (``scheduling.k8s.io/v1beta1``) and the requests
Muster makes for them; a keyed work queue of PodGroups.

A PodGroup is reconciled when it changes (the scheduler writes
``PodGroupInitiallyScheduled``) and when its request changes. Nothing is written to the
PodGroup itself: Muster's word to its owner is an Event on it (``kubectl describe
podgroup``), and the request it creates (owned by the PodGroup) carries the detail.

Started by :class:`controller.operator.Controller` when ``podgroups.enabled``
is set and the cluster serves the API; otherwise it logs why it is off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from controller.common.clock import Clock
from controller.config import PodGroupsConfig
from controller.inputs.podgroup_membership import request_name
from controller.kube import ApiError, Body, KubeClient, WatchEvent, whole_listing
from controller.kube.events import EventRecorder
from controller.kube.resources import POD_TEMPLATES, PODS, PROVISIONING_REQUESTS, Resource
from controller.podgroups.gang import (
    API_VERSION,
    LABEL,
    UID_ANNOTATION,
    GangPodGroup,
    Outcome,
    draft,
    members,
    outcome,
    owner_reference,
    unbound,
)
from controller.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)

POD_GROUPS = Resource("scheduling.k8s.io", "v1beta1", "podgroups", namespaced=True,
                      kind="PodGroup")
EVENT_COMPONENT = "muster-gangs"


def _key(obj: Body) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


class PodGroupIntegration:
    def __init__(
        self, *, kube: KubeClient, config: PodGroupsConfig, clock: Clock,
        events: EventRecorder, concurrency: int = 32,
    ) -> None:
        self.kube = kube
        self.config = config
        self.events = events
        self.groups: dict[str, Body] = {}
        self.requests: dict[str, Body] = {}
        """``<ns>/<request>`` -> Muster's requests for PodGroups (label ``muster.dev/podgroup``)."""
        self._attempts: dict[str, int] = {}
        """PodGroup key -> requests made for it whose booking ended unused (this process)."""
        self._gave_up: set[str] = set()
        self._told: dict[str, tuple[str, str]] = {}
        """PodGroup key -> the last (reason, message) posted, so a repeat is not re-posted."""
        self.queue = WorkQueue(self.reconcile, clock=clock, concurrency=concurrency)
        self._tasks: list[asyncio.Task[None]] = []
        self._synced: dict[str, asyncio.Event] = {}
        self.active = False

    async def serves(self) -> bool:
        return await self.kube.serves(API_VERSION)

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> bool:
        """Watch and work, or log why not and return False (API not served)."""
        if not await self.serves():
            log.info("native gangs off: this cluster does not serve %s PodGroups (Kubernetes "
                     "1.37 with the GenericWorkload feature gate and the API enabled)",
                     API_VERSION)
            return False
        self._watch(POD_GROUPS, self.groups, self._group_changed)
        self._watch(PROVISIONING_REQUESTS, self.requests, self._request_changed,
                    label_selector=LABEL)
        await asyncio.gather(*(e.wait() for e in self._synced.values()))
        self.queue.start()
        self.active = True
        for key in list(self.groups):
            self.queue.add(key)
        log.info("native gangs on: gang PodGroups the scheduler cannot place are provisioned "
                 "as one (class %s)", self.config.provisioning_class)
        return True

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return [*self._tasks, *self.queue.tasks]

    def halt(self) -> None:
        self.queue.halt()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.queue.stop()

    def _watch(
        self, res: Resource, store: dict[str, Body], changed: Callable[[Body], None], *,
        label_selector: str | None = None,
    ) -> None:
        synced = self._synced.setdefault(res.plural, asyncio.Event())

        def on_sync(items: list[Body]) -> None:
            store.clear()
            store.update({_key(i): i for i in items})
            synced.set()
            for item in items:
                changed(item)

        def on_event(ev: WatchEvent) -> None:
            obj = ev.object
            if ev.type == "DELETED":
                store.pop(_key(obj), None)
            else:
                store[_key(obj)] = obj
            changed(obj)

        self._tasks.append(asyncio.create_task(
            self.kube.watch(res, whole_listing(on_sync), on_event, label_selector=label_selector),
            name=f"podgroups-watch-{res.plural}",
        ))

    def _group_changed(self, obj: Body) -> None:
        if self.active:
            self.queue.add(_key(obj))

    def _request_changed(self, obj: Body) -> None:
        group = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL)
        owner = next((o.get("name") for o in (obj.get("metadata") or {}).get(
            "ownerReferences") or [] if o.get("kind") == "PodGroup"), group)
        if self.active and owner:
            self.queue.add(f"{obj['metadata'].get('namespace')}/{owner}")

    # ------------------------------------------------------------------ reconcile

    async def reconcile(self, key: str) -> float | None:
        body = self.groups.get(key)
        if body is None:
            self._told.pop(key, None)
            self._attempts.pop(key, None)
            self._gave_up.discard(key)
            return None  # its request and templates go with it (ownerReferences)
        group = GangPodGroup.of(body)
        if group.min_count is None:
            return None  # basic policy: the scheduler places pod by pod; not a gang
        request = self.requests.get(f"{group.namespace}/{request_name(group.name)}")
        if request is not None and ((request.get("metadata") or {}).get(
                "annotations") or {}).get(UID_ANNOTATION) not in (None, group.uid):
            return None  # an earlier PodGroup's request of that name, being collected
        if request is not None:
            return await self._follow(group, request)
        if group.scheduled or not group.unschedulable:
            return None
        return await self._provision(group, body)

    async def _follow(self, group: GangPodGroup, request: Body) -> float | None:
        if (request.get("metadata") or {}).get("deletionTimestamp"):
            return None  # going; its delete event brings the group back
        said = outcome(request, group)
        if said is None:
            return None
        if not said.retry:
            self._tell(group, said)
            return None
        if group.key in self._gave_up:
            return None
        lost = self._attempts.get(group.key, 0) + 1
        self._attempts[group.key] = lost
        if lost >= self.config.max_attempts:
            self._gave_up.add(group.key)
            self._tell(group, Outcome(
                "Warning", "GangNotProvisioned",
                f"{said.message.removesuffix('; Muster plans it again')}; Muster gave up "
                f"after {lost} booking(s) the scheduler did not use (recreate the PodGroup "
                "to try again)"))
            return None
        self._tell(group, said)
        # A fresh request of the same name once this one is gone.
        await self.kube.delete(PROVISIONING_REQUESTS, request["metadata"]["name"],
                               namespace=group.namespace)
        return None

    async def _provision(self, group: GangPodGroup, body: Body) -> float | None:
        listing = await self.kube.list(PODS, namespace=group.namespace,
                                       field_selector="status.phase=Pending")
        mine = members(listing.get("items") or [], group.name)
        pending = unbound(mine)
        if not pending:
            return None
        if len(mine) < (group.min_count or 1):
            # The scheduler waits for minCount pods before it tries; so does Muster.
            return None
        gang = draft(group, pending, owner_reference(body), self.config.provisioning_class)
        for tpl in gang.templates:
            try:
                await self.kube.create(POD_TEMPLATES, tpl, namespace=group.namespace)
            except ApiError as exc:
                if not exc.conflict:
                    raise
                # Made by an earlier attempt for this very group (the name carries its uid):
                # the same pods, reused.
        try:
            await self.kube.create(PROVISIONING_REQUESTS, gang.request,
                                   namespace=group.namespace)
        except ApiError as exc:
            if not exc.conflict:
                raise
            return None
        topo = f", all in one {group.topology_key}" if group.topology_key else ""
        self._tell(group, Outcome(
            "Normal", "GangProvisioning",
            f"the scheduler cannot place the gang ({group.message or 'Unschedulable'}): "
            f"Muster plans its {gang.pods} pending pod(s) as one gang (minCount "
            f"{group.min_count}{topo}) in ProvisioningRequest {gang.request['metadata']['name']}"
            f", acquiring every node or none"))
        return None

    def _tell(self, group: GangPodGroup, said: Outcome) -> None:
        if self._told.get(group.key) == (said.reason, said.message):
            return
        self._told[group.key] = (said.reason, said.message)
        log.info("PodGroup %s: %s: %s", group.key, said.reason, said.message)
        ref: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "PodGroup",
                               "metadata": {"name": group.name, "namespace": group.namespace,
                                            "uid": group.uid}}
        self.events.event(ref, "Warning" if said.type == "Warning" else "Normal",
                          said.reason, said.message)
