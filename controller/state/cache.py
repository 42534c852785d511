"""The watch-fed cluster cache and the one Snapshot per planning pass built from it.

:class:`ClusterState` holds what the planner needs, fed by list-then-watch loops
(:mod:`controller.state.feeds`) and by the reconciler's own writes: Nodes, the requests of
bound Pods summed per node (kept incrementally, so 100,000 pods cost nothing per pass),
PodTemplates, CapacityPools, ProvisioningRequests, and the booking ledger
(:mod:`controller.state.ledger`, ``state.ledger``) of every request's booking. It owns no
I/O and no clock; it is single-threaded asyncio state, so no lock is needed between the
watch callbacks and :meth:`ClusterState.snapshot`.

Bookings come from two places: the ``muster.dev/plan`` annotation of requests in phase
Acquiring/Booked (survives restarts), and :meth:`BookingLedger.reserve` for a plan the
planner just made and is about to persist, so that the next request planned a millisecond
later already sees the capacity as taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from controller.api.capacitypool import CapacityPool
from controller.api.node import Node
from controller.api.pod import Pod, PodAffinityTerm, PodTemplate
from controller.api.quantity import to_resources
from controller.common.conditions import ConditionType
from controller.common.topology_defaults import (
    KEY_LABEL,
    OWNER_ANNOTATION,
    POOL_LABEL,
    placeholder,
)
from controller.fit import apply_plan
from controller.fit.capacity import BookedMemo
from controller.fit.types import NodeState, Plan, PoolState, Snapshot
from controller.inputs.constraints import BoundPod
from controller.inputs.node_labels import ZONE as ZONE_LABEL
from controller.inputs.podgroup_membership import group_of
from controller.inputs.podgroup_membership import request_name as gang_request_name
from controller.inputs.snapshot import node_state, pod_requests, pool_state
from controller.lifecycle import Phase
from controller.state.bookings import (
    Booking,
    Group,
    effective_plan,
    merge_plans,
)
from controller.state.dra import DraState
from controller.state.ledger import BookingLedger
from controller.state.requests import RequestRecord
from controller.state.tenancy import Usage, gpus_of, owner_uid_of_key, pool_node

log = logging.getLogger(__name__)

Body = dict[str, Any]

CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
DEPRECATED_CONSUME_ANNOTATION = "cluster-autoscaler.kubernetes.io/consume-provisioning-request"

ACTIVE_PHASES = frozenset({Phase.ACQUIRING, Phase.BOOKED})
DELETED_SECONDS = 300.0
"""How long a deleted request's uid is remembered: between this and twice this (two
generations, turned over by :meth:`ClusterState.prune_vanished`), five times the longest a
write or a list can be in flight (the client's timeout is 60 s). Kept by age rather than
count so that a steady stream of requests keeps a steady number of uids: a bound by count
alone lets memory grow for hours before it is reached (docs/benchmarks/soak.md)."""
DELETED_MEMORY = 16_384
"""At most this many uids per generation, however many requests a burst deletes."""


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def _rv(obj: Mapping[str, Any]) -> int | None:
    text = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class PodRecord:
    node: str | None
    requests: Mapping[str, int]
    holds: bool
    """Bound and not finished: counts against its node."""
    consumer: str | None
    """``<namespace>/<request>`` the pod consumes, if any."""
    namespace: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    """Its required pod anti-affinity terms (they repel other pods from its domain)."""


class Relist:
    """One kind's listing fed into the cache page by page, replacing what the cache held:
    each page's objects are stored as they come (``upsert``), and once the last page came,
    every object no page held is dropped (``delete``), then ``done`` runs.

    A listing that starts again (its continue token expired: ``first`` once more) forgets
    what it had seen. Between pages the cache holds the old view with the listed objects
    already updated: never staler than before the listing began."""

    def __init__(
        self,
        keys: Callable[[], Iterable[str]],
        upsert: Callable[[Body], object],
        delete: Callable[[str], None],
        done: Callable[[], None],
    ) -> None:
        self._keys, self._upsert, self._delete, self._done = keys, upsert, delete, done
        self._seen: set[str] = set()

    def page(self, items: Iterable[Body], *, first: bool, last: bool) -> None:
        if first:
            self._seen = set()
        for item in items:
            self._seen.add(object_key(item))
            self._upsert(item)
        if last:
            seen, self._seen = self._seen, set()
            for key in [k for k in self._keys() if k not in seen]:
                self._delete(key)
            self._done()


@dataclass(frozen=True, slots=True)
class TemplateError:
    """A PodTemplate the model refuses: ``detail`` names the first bad field."""

    detail: str


@dataclass(frozen=True, slots=True)
class ReservedCapacity:
    """One reservation (or block) a pool draws from, as the cloud last counted it."""

    zone: str
    """Its zone ("" when the cloud does not say): it caps only that zone's domains."""
    free: int
    reserved: int = 0
    """Its size (0: not known, taken as ``free``)."""
    start: datetime | None = None
    end: datetime | None = None


class ClusterState:
    """In-memory view of the cluster. ``notify`` is called with request keys to reconcile."""

    def __init__(
        self,
        *,
        levels: Sequence[str],
        notify: Callable[[str], None] | None = None,
        forget: Callable[[str], None] | None = None,
    ) -> None:
        self.levels = tuple(levels)
        self.notify: Callable[[str], None] = notify or (lambda key: None)
        self.forget: Callable[[str], None] = forget or (lambda key: None)
        """Told of every request key deleted (the work queue drops its timers)."""
        self.capacity_changed: Callable[[str], None] = lambda why: None
        """Told (with what happened) whenever something changed that could let a waiting
        request fit: a node added, freed or changed, a booking gone, a pool created or
        changed, a refused pool fixed (see :mod:`controller.state.wakeups`)."""
        self.shortage_set: Callable[[datetime], None] = lambda until: None
        """Told when a stock-out's avoidance window will end (:meth:`mark_short`)."""
        self._arrivals: dict[str, int] = {}
        """Request key -> the order the cache first saw it in (ties of creationTimestamp,
        which has one-second resolution)."""
        self._arrived = 0
        self._pool_specs: dict[str, Any] = {}
        """The spec of each pool last seen (status writes do not change what plans see)."""
        self._nodes: dict[str, Node] = {}
        self._nodes_by_key: dict[str, set[str]] = {}
        self._node_by_provider_id: dict[str, str] = {}
        """``spec.providerID`` -> node name: how an acquisition's nodes are known."""
        self._provider_id_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._gone_by_key: dict[str, set[str]] = {}
        self._node_states: dict[str, NodeState] = {}
        self._usage: dict[str, dict[str, int]] = {}
        self._pods: dict[str, PodRecord] = {}
        self._repellers: set[str] = set()
        """Pods with required anti-affinity terms (they repel other pods)."""
        self._consumed: dict[str, dict[str, int]] = {}
        self._pods_on: dict[str, int] = {}
        self._templates: dict[str, PodTemplate] = {}
        self._template_errors: dict[str, TemplateError] = {}
        self._pools: dict[str, CapacityPool] = {}
        self._pool_errors: dict[str, tuple[str, ...]] = {}
        """Every validation error of a pool the model refuses (by name)."""
        self._pool_state_errors: dict[str, str] = {}
        """Pools the model accepts but the planner cannot use (a bad quantity)."""
        self._pool_quantity_errors: dict[str, tuple[str, ...]] = {}
        """Every unreadable node-template amount of a pool the model accepts."""
        self._unusable_pools: dict[str, tuple[str, ...]] = {}
        """Pools whose provider refuses their parameters: left out of planning (every
        acquisition through them would fail)."""
        self._pool_status: dict[str, Body] = {}
        """Each pool's ``status`` as the API server holds it (for the status writer)."""
        self._requests: dict[str, RequestRecord] = {}
        self._uid_namespace: dict[str, str] = {}
        """Request uid -> namespace, kept after a deletion while nodes acquired for the
        request exist (they still count against the namespace's limits)."""
        self._deleted: OrderedDict[str, None] = OrderedDict()
        """uids of requests seen deleted since ``_deleted_turned``, newest last: an answer to
        a write sent before the deletion must not bring the request back into the cache."""
        self._deleted_before: OrderedDict[str, None] = OrderedDict()
        """The generation before (see :data:`DELETED_SECONDS`)."""
        self._deleted_turned: datetime | None = None
        self._nodes_by_pool: dict[str, set[str]] = {}
        """CapacityPool name (the node's pool label) -> its nodes."""
        self.ledger = BookingLedger()
        """Live bookings, releases in flight, acquisitions running (see
        :mod:`controller.state.ledger`)."""
        self._held_cache: dict[str, tuple[Booking, tuple[Any, ...], Plan, tuple[str, ...]]] = {}
        self._booked_memo: BookedMemo = {}
        """Nodes with their bookings applied, reused across passes (apply_plan's memo)."""
        self._short: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, datetime]] = {}
        self._reservation: dict[str, tuple[tuple[ReservedCapacity, ...], int]] = {}
        """Pool -> (the reservations it draws from, its machines the cloud counted then)."""
        self._pool_states: tuple[PoolState, ...] | None = None
        self._deleting_pools: set[str] = set()
        self.pools_changed = asyncio.Event()
        """Set on every pool event (the pool finalizer loop waits on it)."""
        self.dra = DraState(on_event=self.arrived)
        """DRA objects (ResourceSlices, claims, classes, claim templates)."""
        self._waiting: dict[str, set[str]] = {}
        """``Kind key`` (or a bare kind: any of it) -> requests waiting for it to arrive."""
        self._waits: dict[str, set[str]] = {}
        """Request key -> what it waits for (the inverse of ``_waiting``)."""
        self._sorted_nodes: tuple[NodeState, ...] | None = None
        self._ready_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self.synced: dict[str, asyncio.Event] = {
            kind: asyncio.Event() for kind in ("nodes", "pods", "podtemplates", "pools", "requests")
        }
        self.relists: dict[str, Relist] = {
            "nodes": Relist(lambda: self._nodes, self.upsert_node, self.delete_node,
                            self.synced["nodes"].set),
            "pods": Relist(lambda: self._pods, self.upsert_pod, self.delete_pod,
                           self.synced["pods"].set),
            "requests": Relist(lambda: self._requests, self.upsert_request,
                               self.delete_request, self.synced["requests"].set),
        }
        """The kinds large enough to be listed page by page (see :class:`Relist`)."""

    # ------------------------------------------------------------------ nodes

    def replace_nodes(self, items: Iterable[Body]) -> None:
        self.relists["nodes"].page(items, first=True, last=True)

    def upsert_node(self, body: Body) -> None:
        try:
            node = Node.model_validate(_slim_node(body))
        except ValidationError as exc:
            log.warning("ignoring malformed Node %s: %s", object_key(body), exc)
            return
        name = node.metadata.name
        old = self._nodes.get(name)
        self._unindex(name)
        self._nodes[name] = node
        provider_id = node.spec.provider_id
        if provider_id:
            self._node_by_provider_id[provider_id] = name
            self._wake(provider_id)
        self._wake(name)
        labels = node.metadata.labels
        key = labels.get(KEY_LABEL)
        if key:
            self._nodes_by_key.setdefault(key, set()).add(name)
        pool = labels.get(POOL_LABEL)
        if pool:
            self._nodes_by_pool.setdefault(pool, set()).add(name)
        self._refresh_node(name)
        # Pool headroom counts nodes by labels; heartbeats (status only) leave it as it is.
        if old is None or old.metadata.labels != labels:
            self._pool_states = None
        if old is None:
            self.arrived(f"Node {name}")
            self.capacity_changed("node added")
        else:
            if old.metadata.labels != labels or _schedulability(old) != _schedulability(node):
                self.capacity_changed("node changed")
            self._recheck_bookings_on(old, node)
        if node.settled:
            for fut in self._ready_waiters.pop(name, []):
                if not fut.done():
                    fut.set_result(None)

    def _recheck_bookings_on(self, old: Node, node: Node) -> None:
        """A taint, cordon or label change can make a booked existing node unusable for its
        gang: the bookings counting on it check again."""
        if (old.spec.taints == node.spec.taints and old.metadata.labels == node.metadata.labels
                and old.spec.unschedulable == node.spec.unschedulable):
            return
        name = node.metadata.name
        for key, booking in self.ledger.bookings().items():
            if name in booking.existing_nodes:
                self.notify(key)

    def delete_node(self, name: str) -> None:
        self._unindex(name, gone=True)
        old = self._nodes.pop(name, None)
        if old is None:
            return
        self._node_states.pop(name, None)
        self._sorted_nodes = None
        self._pool_states = None
        self.capacity_changed("node deleted")
        provider_id = old.spec.provider_id
        if provider_id:
            if self._node_by_provider_id.get(provider_id) == name:
                del self._node_by_provider_id[provider_id]
            self._wake(provider_id)
        self._wake(name)
        # A booking's new nodes are known by their providerIDs (or, in a booking persisted
        # before the provider answered, by their acquisition key's label).
        acquisition = old.metadata.labels.get(KEY_LABEL)
        for key, booking in self.ledger.bookings().items():
            if (name in booking.existing_nodes or name in booking.acquired_nodes
                    or (provider_id and provider_id in booking.acquired_provider_ids)
                    or any(g.key == acquisition for g in booking.groups)):
                self.notify(key)

    def _unindex(self, name: str, *, gone: bool = False) -> None:
        old = self._nodes.get(name)
        pool = old.metadata.labels.get(POOL_LABEL) if old is not None else None
        if pool and pool in self._nodes_by_pool:
            self._nodes_by_pool[pool].discard(name)
            if not self._nodes_by_pool[pool]:
                del self._nodes_by_pool[pool]
        key = old.metadata.labels.get(KEY_LABEL) if old is not None else None
        if gone and key:
            self._gone_by_key.setdefault(key, set()).add(name)
        if key and key in self._nodes_by_key:
            self._nodes_by_key[key].discard(name)
            if not self._nodes_by_key[key]:
                del self._nodes_by_key[key]

    def vanished(self, key: str) -> list[str]:
        """Nodes of acquisition ``key`` seen deleted since this process started."""
        return sorted(self._gone_by_key.get(key, ()))

    def prune_vanished(self, now: datetime) -> None:
        """Forget deleted-node records of keys no active booking holds, the namespaces of
        deleted requests none of whose nodes is left, and the uids of requests deleted more
        than :data:`DELETED_SECONDS` before ``now`` (keeps memory flat)."""
        if self._deleted_turned is None:
            self._deleted_turned = now
        elif (now - self._deleted_turned).total_seconds() >= DELETED_SECONDS:
            self._deleted_before, self._deleted = self._deleted, OrderedDict()
            self._deleted_turned = now
        live = {g.key for b in self.ledger.bookings().values() for g in b.groups}
        for key in [k for k in self._gone_by_key if k not in live]:
            del self._gone_by_key[key]
        held = {owner_uid_of_key(k) for k in self._nodes_by_key}
        held.update(r.uid for r in self._requests.values())
        for uid in [u for u in self._uid_namespace if u not in held]:
            del self._uid_namespace[uid]

    def nodes_by_key(self) -> Mapping[str, set[str]]:
        """Acquisition key -> names of the registered nodes carrying it."""
        return self._nodes_by_key

    def node_by_provider_id(self, provider_id: str) -> Node | None:
        """The registered Node whose ``spec.providerID`` is ``provider_id``."""
        name = self._node_by_provider_id.get(provider_id)
        return self._nodes.get(name) if name is not None else None

    def group_node_names(self, group: Group) -> tuple[str, ...]:
        """The group's registered nodes (sorted): found by the providerIDs the provider
        launched; a group persisted before the provider answered (or by an older Muster)
        by the names recorded, else by its acquisition-key label."""
        if group.provider_ids:
            found = (self._node_by_provider_id.get(p) for p in group.provider_ids)
            return tuple(sorted(n for n in found if n is not None))
        if group.nodes:
            return tuple(n for n in group.nodes if n in self._nodes)
        return tuple(sorted(self._nodes_by_key.get(group.key, ())))

    def changed(self, provider_ids: Iterable[str]) -> asyncio.Future[None]:
        """A future done at the next change (registration, update, deletion) of a node
        with one of ``provider_ids`` (or named one of them); the caller cancels it when it
        stops waiting."""
        provider_ids = set(provider_ids)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for pid in set(provider_ids):
            self._provider_id_waiters.setdefault(pid, []).append(fut)

        def forget(done: asyncio.Future[None]) -> None:
            for pid in set(provider_ids):
                waiters = self._provider_id_waiters.get(pid)
                if waiters and done in waiters:
                    waiters.remove(done)
                    if not waiters:
                        del self._provider_id_waiters[pid]

        fut.add_done_callback(forget)
        return fut

    def _wake(self, provider_id: str) -> None:
        for fut in list(self._provider_id_waiters.get(provider_id, ())):
            if not fut.done():
                fut.set_result(None)

    def _refresh_node(self, name: str) -> None:
        node = self._nodes.get(name)
        self._sorted_nodes = None
        if node is None:
            return
        try:
            self._node_states[name] = node_state(node, self._usage.get(name))
        except ValueError as exc:
            log.warning("ignoring Node %s with bad allocatable: %s", name, exc)
            self._node_states.pop(name, None)

    def node(self, name: str) -> Node | None:
        return self._nodes.get(name)

    def node_exists(self, name: str) -> bool:
        return name in self._nodes

    def node_ready(self, name: str) -> bool:
        """Ready and settled (no start-up taint left): pods can be placed on it now."""
        node = self._nodes.get(name)
        return node is not None and node.settled

    def nodes(self) -> Mapping[str, Node]:
        return self._nodes

    async def wait_ready(
        self, names: Sequence[str], *, within: float, sleep: Callable[[float], Any]
    ) -> list[str]:
        """Wait until every node in ``names`` is Ready and settled (see
        :attr:`Node.settled`) or ``within`` seconds pass (injected ``sleep``); return the
        names still not so."""
        pending = [n for n in names if not self.node_ready(n)]
        if not pending:
            return []
        loop = asyncio.get_running_loop()
        futures = []
        for name in pending:
            fut: asyncio.Future[None] = loop.create_future()
            self._ready_waiters.setdefault(name, []).append(fut)
            futures.append(fut)
        everything = asyncio.ensure_future(asyncio.gather(*futures))
        everything.add_done_callback(_retrieve)
        timer = asyncio.ensure_future(sleep(within))
        try:
            await asyncio.wait({everything, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            everything.cancel()
            for name, fut in zip(pending, futures, strict=True):
                waiters = self._ready_waiters.get(name)
                if waiters and fut in waiters:
                    waiters.remove(fut)
                    if not waiters:
                        del self._ready_waiters[name]
        return [n for n in names if not self.node_ready(n)]

    # ------------------------------------------------------------------ pods

    def replace_pods(self, items: Iterable[Body]) -> None:
        self.relists["pods"].page(items, first=True, last=True)

    def upsert_pod(self, body: Body) -> None:
        key = object_key(body)
        record = _pod_record(body)
        old = self._forget_pod(key)
        if old is not None and old.holds and old.node and not (
                record is not None and record.holds and record.node == old.node):
            self.capacity_changed("pod finished")
        if record is None:
            return
        self._pods[key] = record
        if record.anti_affinity:
            self._repellers.add(key)
        if record.holds and record.node:
            usage = self._usage.setdefault(record.node, {})
            for res, amount in record.requests.items():
                usage[res] = usage.get(res, 0) + amount
            self._pods_on[record.node] = self._pods_on.get(record.node, 0) + 1
            self._refresh_node(record.node)
            if record.consumer:
                per_node = self._consumed.setdefault(record.consumer, {})
                per_node[record.node] = per_node.get(record.node, 0) + 1
        if record.consumer:
            self.notify(record.consumer)

    def delete_pod(self, key: str) -> None:
        record = self._forget_pod(key)
        if record is not None and record.holds and record.node:
            self.capacity_changed("pod deleted")
        if record is not None and record.consumer:
            self.notify(record.consumer)

    def _forget_pod(self, key: str) -> PodRecord | None:
        record = self._pods.pop(key, None)
        if record is None:
            return None
        self._repellers.discard(key)
        if record.holds and record.node:
            usage = self._usage.get(record.node, {})
            for res, amount in record.requests.items():
                usage[res] = usage.get(res, 0) - amount
            self._pods_on[record.node] = self._pods_on.get(record.node, 1) - 1
            self._refresh_node(record.node)
            if record.consumer:
                per_node = self._consumed.get(record.consumer, {})
                per_node[record.node] = per_node.get(record.node, 1) - 1
                if per_node[record.node] <= 0:
                    del per_node[record.node]
                if not per_node:
                    self._consumed.pop(record.consumer, None)
        return record

    def bound_pods(self, *, every: bool) -> list[BoundPod]:
        """Running pods for inter-pod constraints: those with required anti-affinity (they
        repel every gang), and with ``every`` all of them (for a gang with pod affinity or
        anti-affinity terms of its own)."""
        out = []
        keys = self._pods if every else self._repellers
        for key in keys:
            record = self._pods[key]
            if not (record.holds and record.node):
                continue
            node = self._nodes.get(record.node)
            if node is not None:
                out.append(BoundPod(record.namespace, record.labels, node.metadata.labels,
                                    record.anti_affinity, node=record.node))
        return out

    def scheduled_consumers(self, request_key: str) -> Mapping[str, int]:
        """Node -> bound pods consuming ``request_key`` (``<ns>/<name>``)."""
        return self._consumed.get(request_key, {})

    def pods_on(self, node: str) -> int:
        """Bound pods still holding capacity on ``node``."""
        return self._pods_on.get(node, 0)

    # ------------------------------------------------------------------ late arrivals

    def wait_for(self, request_key: str, wanted: Iterable[str]) -> None:
        """Reconcile ``request_key`` as soon as one of ``wanted`` arrives (``Kind key``,
        e.g. ``PodTemplate ns/t``, ``DeviceClass gpu``; a bare kind: any object of it),
        instead of what it waited for before. Empty: it waits for nothing."""
        for old in self._waits.pop(request_key, ()):
            keys = self._waiting.get(old)
            if keys is not None:
                keys.discard(request_key)
                if not keys:
                    del self._waiting[old]
        wanted = set(wanted)
        if wanted:
            self._waits[request_key] = wanted
            for w in wanted:
                self._waiting.setdefault(w, set()).add(request_key)

    def waiting_for(self, request_key: str) -> frozenset[str]:
        return frozenset(self._waits.get(request_key, ()))

    def arrived(self, wanted: str) -> None:
        """``Kind key`` arrived or changed: the requests waiting for it (or for any of its
        kind) are planned again now, not at their next timer."""
        kind = wanted.partition(" ")[0]
        keys = self._waiting.get(wanted, set()) | self._waiting.get(kind, set())
        for key in keys:
            self.wait_for(key, ())
            self.notify(key)

    # ------------------------------------------------------------------ templates, pools

    def replace_templates(self, items: Iterable[Body]) -> None:
        self._templates.clear()
        self._template_errors.clear()
        for item in items:
            self.upsert_template(item, notify=False)
        self.synced["podtemplates"].set()
        # A relist may have missed deletions and edits: every booking re-checks, once.
        for key in self.ledger.persisted_keys():
            self.notify(key)

    def upsert_template(self, body: Body, *, notify: bool = True) -> None:
        key = object_key(body)
        try:
            self._templates[key] = PodTemplate.model_validate(body)
            self._template_errors.pop(key, None)
        except ValidationError as exc:
            self._templates.pop(key, None)
            self._template_errors[key] = TemplateError(_first_error(exc))
        self.arrived(f"PodTemplate {key}")
        if notify:
            self._notify_bookings_of(key)

    def delete_template(self, key: str) -> None:
        self._templates.pop(key, None)
        self._template_errors.pop(key, None)
        self._notify_bookings_of(key)

    def _notify_bookings_of(self, template_key: str) -> None:
        """Requests holding a booking planned from this template re-check it."""
        namespace, _, name = template_key.partition("/")
        for key in self.ledger.persisted_keys():
            if not key.startswith(f"{namespace}/"):
                continue
            record = self._requests.get(key)
            if record is not None and name in record.template_names:
                self.notify(key)

    def template(self, namespace: str, name: str) -> PodTemplate | TemplateError | None:
        """The parsed template, why it is malformed, or None when missing."""
        key = f"{namespace}/{name}"
        return self._templates.get(key) or self._template_errors.get(key)

    def replace_pools(self, items: Iterable[Body]) -> None:
        self._pools.clear()
        errors, self._pool_errors = self._pool_errors, {}
        self._pool_status.clear()
        self._pool_quantity_errors.clear()
        self._deleting_pools.clear()
        self._sorted_nodes = None
        for item in items:
            self.upsert_pool(item, known_errors=errors)
        self.synced["pools"].set()

    def upsert_pool(
        self, body: Body, *, known_errors: Mapping[str, tuple[str, ...]] | None = None
    ) -> None:
        name = str((body.get("metadata") or {}).get("name"))
        self._pool_states = None
        self.pools_changed.set()
        self._pool_status[name] = dict(body.get("status") or {})
        deleting = bool((body.get("metadata") or {}).get("deletionTimestamp"))
        if deleting != (name in self._deleting_pools):
            # Its nodes stop (or start) being plannable: node states are rebuilt.
            self._deleting_pools.symmetric_difference_update({name})
            self._sorted_nodes = None
        spec = body.get("spec")
        if self._pool_specs.get(name) != spec or deleting:
            # Created, or its spec edited (a limit raised, a domain added); a status write
            # (the pool status writer's, every few seconds) changes nothing a plan sees.
            self._pool_specs[name] = spec
            self.capacity_changed("pool changed")
        before = (known_errors or self._pool_errors).get(name)
        quantities = _quantity_errors(body)
        old = self._pools.get(name)
        try:
            # A pool with unreadable amounts stays known (its nodes can still be released);
            # the snapshot leaves it out of planning.
            self._pools[name] = pool = CapacityPool.model_validate(body)
            if old is None or old.spec != pool.spec:
                # Not on its status writes: only a new or changed pool can make a gang fit.
                self.arrived(f"CapacityPool {name}")
            self._pool_errors.pop(name, None)
            if quantities:
                self._pool_quantity_errors[name] = quantities
            else:
                self._pool_quantity_errors.pop(name, None)
        except ValidationError as exc:
            self._pools.pop(name, None)
            errors = (*_all_errors(exc), *quantities)
            self._pool_errors[name] = errors
            # Once per change: every status write and finalizer patch brings the pool back.
            if errors != before:
                log.warning("ignoring invalid CapacityPool %s (%d problem(s)): %s", name,
                            len(errors), "; ".join(errors))

    def delete_pool(self, name: str) -> None:
        self.pools_changed.set()
        self._pool_specs.pop(name, None)
        self._pools.pop(name, None)
        self._pool_errors.pop(name, None)
        self._pool_state_errors.pop(name, None)
        self._pool_quantity_errors.pop(name, None)
        self._unusable_pools.pop(name, None)
        self._pool_status.pop(name, None)
        self._pool_states = None
        if name in self._deleting_pools:
            self._deleting_pools.discard(name)
            self._sorted_nodes = None

    def pool_errors(self, name: str) -> tuple[str, ...]:
        """Why Muster does not plan on pool ``name`` (empty: it does): every error."""
        if name in self._pool_errors:
            return self._pool_errors[name]
        if self._pool_quantity_errors.get(name):
            return self._pool_quantity_errors[name]
        found = self._pool_state_errors.get(name)
        return (found,) if found else ()

    def set_pool_unusable(self, name: str, problems: Sequence[str]) -> None:
        """The provider refuses pool ``name``'s parameters (``problems``; empty: it accepts
        them): the planner leaves the pool out until they are fixed."""
        problems = tuple(problems)
        if self._unusable_pools.get(name, ()) == problems:
            return
        if problems:
            self._unusable_pools[name] = problems
        else:
            self._unusable_pools.pop(name, None)
            self.capacity_changed("pool usable")
        self._pool_states = None

    def unusable_pools(self) -> Mapping[str, tuple[str, ...]]:
        """Pools the provider refuses (left out of planning), with its problems."""
        return self._unusable_pools

    def invalid_pools(self) -> Mapping[str, tuple[str, ...]]:
        """Pools the model refuses, with every error."""
        return self._pool_errors

    def pool_status(self, name: str) -> Body:
        """The pool's ``status`` as last seen from the API server."""
        return self._pool_status.get(name, {})

    def pool_deleting(self, name: str) -> bool:
        """The pool has a deletionTimestamp: Muster adds no node to it, plans nothing new on
        its nodes, and releases them as their bookings and pods end (its finalizer keeps
        the object, and so the provider's settings, until then)."""
        return name in self._deleting_pools

    def pool_node_count(self, name: str) -> int:
        return len(self._nodes_by_pool.get(name, ()))

    def pool_in_use(self, name: str) -> bool:
        """Nodes of the pool exist, or an acquisition through it runs: its finalizer must
        stay, since releasing those nodes needs the pool's provider settings."""
        return bool(self._nodes_by_pool.get(name)) or self.ledger.acquiring(name)

    def pools(self) -> Mapping[str, CapacityPool]:
        return self._pools

    # ------------------------------------------------------------------ requests, bookings

    def replace_requests(self, items: Iterable[Body]) -> None:
        self.relists["requests"].page(items, first=True, last=True)

    def upsert_request(self, body: Body) -> RequestRecord | None:
        """Parse and store ``body`` unless an equal or newer version is held, or the request
        was seen deleted; the stored record, None when not stored."""
        key = object_key(body)
        meta = body.get("metadata") or {}
        uid = meta.get("uid")
        if uid and (uid in self._deleted or uid in self._deleted_before):
            return None
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # Deleting with no finalizer left: gone from the API server already (the answer
            # to the write that removed the last finalizer says so before the watch does).
            self.delete_request(key, uid=uid)
            return None
        old = self._requests.get(key)
        if old is not None:
            old_rv, new_rv = _rv(old.body), _rv(body)
            if old_rv is not None and new_rv is not None and new_rv < old_rv:
                return None
        record = RequestRecord.parse(body, old)
        self._requests[key] = record
        if key not in self._arrivals:
            self._arrived += 1
            self._arrivals[key] = self._arrived
        had_booking = self.ledger.persisted(key)
        if uid and meta.get("namespace"):
            self._uid_namespace[str(uid)] = str(meta["namespace"])
        if record.annotated_phase in ACTIVE_PHASES and not record.deleting:
            if record.booking is None and record.booking_error is not None and (
                    old is None or old.booking_error != record.booking_error):
                log.warning("request %s: %s", key, record.booking_error)
            self.ledger.record(key, record.booking)
        else:
            self.ledger.record(key, None)
        if had_booking and not self.ledger.holds(key):
            self.capacity_changed("booking ended")
        return record

    def delete_request(self, key: str, *, uid: str | None = None) -> None:
        """Forget the request; ``uid`` (else the cached one's) is remembered as deleted."""
        self._held_cache.pop(key, None)
        old = self._requests.pop(key, None)
        self._arrivals.pop(key, None)
        self.wait_for(key, ())
        if self.ledger.drop(key):
            self.capacity_changed("request deleted")
        uid = uid or (old.uid if old is not None else None)
        if uid:
            self._deleted[uid] = None
            if len(self._deleted) > DELETED_MEMORY:
                self._deleted.popitem(last=False)
        self.forget(key)

    def request(self, key: str) -> RequestRecord | None:
        return self._requests.get(key)

    def requests(self) -> Mapping[str, RequestRecord]:
        return self._requests

    def arrival(self, key: str) -> tuple[datetime, int]:
        """Where ``key`` stands in the order of arrival: its creationTimestamp, then the
        order the cache first saw it in (a request not cached sorts last)."""
        record = self._requests.get(key)
        created = record.created_at if record is not None else None
        return (created or _LAST, self._arrivals.get(key, sys.maxsize))

    def booked_nodes(self, *, exclude: str | None = None) -> set[str]:
        """Nodes some live booking (but ``exclude``'s) counts on: existing nodes its plan
        places pods on, and the nodes of its own acquisitions. Whoever acquired a node, it
        must not be released while any of these bookings lives."""
        out: set[str] = set()
        for key, booking in self.ledger.bookings().items():
            if key == exclude:
                continue
            out.update(booking.existing_nodes)
            for group in booking.groups:
                out.update(group.nodes)
                out.update(self.group_node_names(group))
                out.update(self._nodes_by_key.get(group.key, ()))
        return out

    def booked_provider_ids(self) -> set[str]:
        """providerIDs of the machines every live booking's acquisitions launched."""
        return {p for booking in self.ledger.bookings().values()
                for p in booking.acquired_provider_ids}

    # ------------------------------------------------------------------ tenancy

    def plan_usage(self, groups: Iterable[tuple[str, int]]) -> Usage:
        """What new nodes ``(pool, count)`` would add to a namespace's usage."""
        total = Usage()
        for pool, count in groups:
            total = total + pool_node(self._pools.get(pool)).times(count)
        return total

    def namespace_usage(self, namespace: str) -> Usage:
        """What the requests of ``namespace`` hold now (see :mod:`controller.state.tenancy`):
        their live bookings' planned new nodes, plus nodes acquired for them that no live
        booking holds. Reservations made earlier in the same planning pass count, so a
        burst of requests cannot jointly exceed a limit."""
        prefix = f"{namespace}/"
        held: set[str] = set()
        total = Usage()
        for key, booking in self.ledger.bookings().items():
            if not key.startswith(prefix):
                continue
            for group in booking.groups:
                held.add(group.key)
                total = total + pool_node(self._pools.get(group.pool)).times(group.count)
        for key, names in self._nodes_by_key.items():
            if key in held:
                continue
            for name in names:
                node = self._nodes.get(name)
                if node is None or self._node_namespace(key, node) != namespace:
                    continue
                pool = self._pools.get(node.metadata.labels.get(POOL_LABEL, ""))
                price = pool.spec.price_per_node_hour if pool is not None else 0.0
                total = total + Usage(1, gpus_of(node.allocatable()), price)
        return total

    def _node_namespace(self, key: str, node: Node) -> str | None:
        """The namespace of the request ``node`` was acquired for: its acquisition key's
        uid, else the node's owner annotation (survives a restart after the deletion)."""
        found = self._uid_namespace.get(owner_uid_of_key(key))
        if found is not None:
            return found
        owner = node.metadata.annotations.get(OWNER_ANNOTATION, "")
        return owner.partition("/")[0] if "/" in owner else None

    # ------------------------------------------------------------------ snapshot

    def _held(self, key: str, booking: Booking) -> Plan:
        """:func:`effective_plan` of one booking, memoised on exactly what it depends on
        (the booking, its consumers, its keys' registered nodes, its named nodes), so a
        planning pass costs O(changed bookings), not O(all bookings)."""
        consumers = self.scheduled_consumers(key)
        cached = self._held_cache.get(key)
        if cached is not None and cached[0] is not booking:
            cached = None  # another booking: nothing of the memo applies
        named = cached[3] if cached is not None else _nodes_named(booking)
        nodes = self._nodes
        registered = {g.key: self._registered(g) for g in booking.groups}
        signature = (
            tuple(sorted(consumers.items())) if consumers else (),
            tuple([registered[g.key] for g in booking.groups]),
            tuple([n in nodes for n in named]),
        )
        if cached is not None and cached[1] == signature:
            return cached[2]
        plan = effective_plan(
            booking,
            existing=_Present(self._nodes),
            scheduled_on=consumers,
            nodes_by_key=registered,
        )
        self._held_cache[key] = (booking, signature, plan, named)
        return plan

    def _registered(self, group: Group) -> tuple[str, ...]:
        """The group's nodes Muster registered (found by providerID and carrying the pool's
        label, so the pool's node count includes them), else by the acquisition-key label.
        A node that appeared but is not registered yet stays booked as a new node."""
        if group.provider_ids:
            return tuple(n for n in self.group_node_names(group)
                         if self._nodes[n].metadata.labels.get(POOL_LABEL) == group.pool)
        return tuple(sorted(self._nodes_by_key.get(group.key, ())))

    def mark_short(
        self, pool: str, domain: Mapping[str, str], *, available: int, until: datetime
    ) -> None:
        """The provider ran out of stock in ``domain``: plan at most ``available`` new nodes
        there until ``until``, so retries look elsewhere instead of failing the same way.

        A placeholder domain (a pool without declared domains) is no place: the cloud chose
        where it looked, and the next acquisition is a domain of its own again. Remembering
        it would leave such a pool nothing to plan, each retry failing without asking the
        cloud; the request's backoff is the only wait, as for any failed acquisition."""
        if any(placeholder(v) for v in domain.values()):
            return
        self._short[(pool, tuple(sorted(domain.items())))] = (available, until)
        self._pool_states = None
        self.shortage_set(until)

    def set_pool_reservation(
        self, pool: str, reserved: Sequence[ReservedCapacity] | None
    ) -> None:
        """Pool ``pool`` draws only from the reservations ``reserved`` (None: it names
        none), as the cloud counted them just now: plan at most their free instances there,
        per zone, and none outside a reservation's window, so a gang the reservation cannot
        hold whole is planned elsewhere instead of failing at the cloud.

        The cloud's ``free`` already counts the instances Muster held at the read; the ones
        registered since are subtracted (see :meth:`_apply_reservations`), so two gangs
        planned between reads cannot book the same reserved instances."""
        if reserved is None:
            if self._reservation.pop(pool, None) is not None:
                self._pool_states = None
            return
        self._reservation[pool] = (tuple(reserved), self._pool_held_nodes(pool))
        self._pool_states = None

    def _pool_held_nodes(self, pool: str) -> int:
        """Machines of ``pool`` the cloud counts as running: its registered nodes, and the
        ones a booking's acquisition launched that have not registered yet."""
        held = len(self._nodes_by_pool.get(pool, ()))
        for booking in self.ledger.bookings().values():
            for group in booking.groups:
                if group.pool == pool and group.provider_ids:
                    held += max(0, len(group.provider_ids) - len(self._registered(group)))
        return held

    def _capped(self, states: tuple[PoolState, ...], now: datetime) -> tuple[PoolState, ...]:
        """Pools with their headroom capped by stock-outs and reservations (as of ``now``)."""
        if self._short:
            states = self._apply_shortages(states, now)
        if self._reservation:
            states = self._apply_reservations(states, now)
        return states

    def _apply_reservations(self, states: tuple[PoolState, ...], now: datetime) -> tuple[
        PoolState, ...
    ]:
        """Each reserved pool's new nodes capped at its reservations' free instances (those
        open at ``now``), a domain in a zone at what the zone's reservations hold; the pool
        marked ``reserved`` so the engine prefers it over on-demand capacity."""
        out = []
        for pool in states:
            held = self._reservation.get(pool.name)
            if held is None:
                out.append(pool)
                continue
            reserved, held_at_read = held
            # Nodes registered since the read were free in the cloud's figures: not any more.
            # (Nodes planned but not yet registered are the workspace's bookings.)
            since = held_at_read - len(self._nodes_by_pool.get(pool.name, ()))
            open_now = [r for r in reserved
                        if (r.start is None or r.start <= now) and (r.end is None or now < r.end)]
            cap = max(0, sum(r.free for r in open_now) + since)
            # What the pool could get were the reservations free and begun: the ones not
            # ended, whole, less the pool's own nodes in them.
            live = [r for r in reserved if r.end is None or now < r.end]
            ceiling = max(0, sum(max(r.reserved, r.free) for r in live)
                          - len(self._nodes_by_pool.get(pool.name, ())))
            busy = max(0, min(pool.max_new_nodes, ceiling) - min(pool.max_new_nodes, cap))
            by_zone: dict[str, int] = {}
            for r in open_now:
                if r.zone:
                    by_zone[r.zone] = by_zone.get(r.zone, 0) + r.free
            out.append(replace(
                pool, max_new_nodes=min(pool.max_new_nodes, cap), reserved=bool(open_now),
                reserved_busy=busy, open_seconds=_open_seconds(open_now, now),
                domains=tuple(replace(d, max_new_nodes=min(
                    d.max_new_nodes, _zone_cap(d.labels, cap, by_zone, since)))
                    for d in pool.domains),
            ))
        return tuple(out)

    def shortages(self, now: datetime) -> dict[str, list[tuple[dict[str, str], int, datetime]]]:
        """Pool -> (domain, nodes available, until) of each stock-out still in force."""
        out: dict[str, list[tuple[dict[str, str], int, datetime]]] = {}
        for (pool, domain), (available, until) in sorted(self._short.items()):
            if until > now:
                out.setdefault(pool, []).append((dict(domain), available, until))
        return out

    def _apply_shortages(self, states: tuple[PoolState, ...], now: datetime) -> tuple[
        PoolState, ...
    ]:
        expired = [k for k, (_, until) in self._short.items() if until <= now]
        for k in expired:
            del self._short[k]
        if not self._short:
            return states
        out = []
        for pool in states:
            domains = tuple(
                replace(d, max_new_nodes=min(d.max_new_nodes, short[0]))
                if (short := self._short.get((pool.name, tuple(sorted(d.labels.items())))))
                else d
                for d in pool.domains
            )
            out.append(replace(pool, domains=domains))
        return tuple(out)

    def _unconfirmed_off(self, nodes: tuple[NodeState, ...], bookings: Mapping[str, Booking],
                         exclude: str | None) -> tuple[NodeState, ...]:
        """``nodes`` with those of acquisitions not yet confirmed (Provisioned=True not yet
        written) or being released made unschedulable for others: such an acquisition may
        still be rolled back (a failure, nodes not Ready in time, a resumed attempt that
        fails), deleting its nodes under whoever booked their spare capacity meanwhile."""
        blocked: set[str] = set()
        for releasing in self.ledger.releasing_keys():
            blocked.update(self._nodes_by_key.get(releasing, ()))
        for key in self.ledger.released_keys():
            left = self._nodes_by_key.get(key)
            if left:
                blocked.update(left)
            else:
                self.ledger.forget_released((key,))
        for key, booking in bookings.items():
            if key == exclude or not booking.groups or _confirmed(self._requests.get(key)):
                continue
            for group in booking.groups:
                blocked.update(self._nodes_by_key.get(group.key, ()))
                blocked.update(self._registered(group))
        if not blocked:
            return nodes
        return tuple(replace(n, schedulable=False) if n.name in blocked and n.schedulable
                     else n for n in nodes)

    def snapshot(self, *, exclude: str | None = None, now: datetime | None = None,
                 with_unusable: bool = False) -> Snapshot:
        """The fit engine's view: free capacity minus every booking but ``exclude``'s, and
        pool headroom capped where the provider recently ran out of stock (as of ``now``).

        ``with_unusable``: also the pools the provider refuses, as they would be once fixed
        (to tell a request which of them would serve it; never to plan on)."""
        if self._sorted_nodes is None:
            self._sorted_nodes = tuple(
                replace(self._node_states[n], schedulable=False)
                if self._node_states[n].pool in self._deleting_pools
                else self._node_states[n]
                for n in sorted(self._node_states)
            )
        if self._pool_states is None:
            states = []
            for name in sorted(self._pools):
                if (name in self._deleting_pools or name in self._unusable_pools
                        or self._pool_quantity_errors.get(name)):
                    continue
                try:
                    # Only the pool's own nodes: pool_state counts them in one pass.
                    members = self._nodes_by_pool.get(name, ())
                    states.append(pool_state(self._pools[name],
                                             [self._nodes[n] for n in members],
                                             self.levels, in_flight=0))
                    self._pool_state_errors.pop(name, None)
                except ValueError as exc:
                    # Rebuilt whenever a node comes or goes: say it once per change.
                    if self._pool_state_errors.get(name) != str(exc):
                        log.warning("ignoring CapacityPool %s: %s", name, exc)
                    self._pool_state_errors[name] = str(exc)
            self._pool_states = tuple(states)
        pools = self._pool_states
        if with_unusable:
            pools = tuple(sorted((*pools, *self._unusable_states()), key=lambda p: p.name))
        if now is not None:
            pools = self._capped(pools, now)
        bookings = self.ledger.bookings()
        nodes_now, pools_now = self.dra.attach(
            self._unconfirmed_off(self._sorted_nodes, bookings, exclude), pools,
            list(self._pools.values())
        )
        snap = Snapshot(nodes=nodes_now, pools=pools_now, levels=self.levels)
        plans = [self._held(key, b) for key, b in bookings.items() if key != exclude]
        if len(self._held_cache) > 2 * len(bookings) + 64:
            self._held_cache = {k: v for k, v in self._held_cache.items() if k in bookings}
        merged = merge_plans(plans)
        if merged is None:
            return snap
        if len(self._booked_memo) > 2 * len(self._nodes) + 64:
            self._booked_memo = {k: v for k, v in self._booked_memo.items() if k in self._nodes}
        return apply_plan(snap, merged, memo=self._booked_memo)

    def _unusable_states(self) -> list[PoolState]:
        out = []
        for name in sorted(self._unusable_pools):
            if (name not in self._pools or name in self._deleting_pools
                    or self._pool_quantity_errors.get(name)):
                continue
            with contextlib.suppress(ValueError):  # unreadable: no fix of parameters helps
                out.append(pool_state(self._pools[name],
                                      [self._nodes[n] for n in self._nodes_by_pool.get(name, ())],
                                      self.levels, in_flight=0))
        return out


def _zone_cap(labels: Mapping[str, str], cap: int, by_zone: Mapping[str, int],
              since: int) -> int:
    """New nodes a domain may add from its pool's reservations: what those of its zone
    hold (none when they are all elsewhere), the whole ``cap`` when zones are not known."""
    zone = labels.get(ZONE_LABEL)
    if zone is None or not by_zone or placeholder(zone):
        # A placeholder zone is the cloud's to pick: the provider launches into the
        # reservation's own zone.
        return cap
    return min(cap, max(0, by_zone[zone] + since)) if zone in by_zone else 0


def _open_seconds(open_now: Sequence[ReservedCapacity], now: datetime) -> float | None:
    """How long the pool's open reservations still hold a run: until the last of them ends
    (a run fits one that outlives it); None when none is open or one has no end."""
    if not open_now or any(r.end is None for r in open_now):
        return None
    return max((r.end - now).total_seconds() for r in open_now if r.end is not None)


_LAST = datetime.max.replace(tzinfo=UTC)


def _schedulability(node: Node) -> tuple[Any, ...]:
    """What of a node decides whether pods can go to it, beside its labels: readiness,
    start-up and other taints, cordoning, allocatable."""
    return (node.usable, node.spec.unschedulable, node.spec.taints, node.allocatable())


def _confirmed(record: RequestRecord | None) -> bool:
    """Provisioned=True: the booking's acquisition is over and will not be rolled back."""
    return record is not None and record.condition_true(ConditionType.PROVISIONED)


def _nodes_named(booking: Booking) -> tuple[str, ...]:
    return (*booking.existing_nodes, *booking.acquired_nodes)


class _Present(Mapping[str, bool]):
    """Node name -> True for every node in the cache, without copying the dict per pass."""

    def __init__(self, nodes: Mapping[str, Any]) -> None:
        self._nodes = nodes

    def __getitem__(self, name: str) -> bool:
        if name in self._nodes:
            return True
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    # Waiters are cancelled on timeout; fetch the outcome so asyncio does not log it.
    if not fut.cancelled():
        fut.exception()


def _quantity_errors(body: Mapping[str, Any]) -> tuple[str, ...]:
    """Every node-template amount that is no Kubernetes quantity (the model keeps them as
    strings; the planner could not read them)."""
    template = ((body.get("spec") or {}).get("nodeTemplate") or {})
    out = []
    for part in ("allocatable", "capacity"):
        amounts = template.get(part)
        if not isinstance(amounts, Mapping):
            continue
        for res, value in amounts.items():
            try:
                to_resources({str(res): str(value)})
            except ValueError as exc:
                why = str(exc).removeprefix(f"{res}: ")
                out.append(f"spec.nodeTemplate.{part}.{res}: {why}")
    return tuple(out)


def _all_errors(exc: ValidationError) -> tuple[str, ...]:
    return tuple(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
        for err in exc.errors()
    )


def _first_error(exc: ValidationError) -> str:
    # The field path as the API server writes it: list items as [i], not .i.
    err = exc.errors()[0]
    where = ""
    for part in err["loc"]:
        where += f"[{part}]" if isinstance(part, int) else f".{part}" if where else str(part)
    return f"{where}: {err['msg']}"


NODE_STATUS_KEPT = ("allocatable", "capacity", "conditions")
NODE_CONDITION_KEPT = ("type", "status", "reason", "message")


def _slim_node(body: Body) -> Body:
    """What the cache keeps of a Node: the model keeps unknown fields, and managedFields,
    images, nodeInfo, addresses and heartbeat times were most of its memory
    (docs/benchmarks/memory.md) with nothing in Muster reading them."""
    if not isinstance(body, Mapping):
        return body  # a model already (tests build them)
    meta = body.get("metadata")
    status = body.get("status")
    out = dict(body)
    if isinstance(meta, Mapping) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    if isinstance(status, Mapping):
        slim = {k: status[k] for k in NODE_STATUS_KEPT if k in status}
        conditions = slim.get("conditions")
        if isinstance(conditions, list):
            slim["conditions"] = [
                {k: c[k] for k in NODE_CONDITION_KEPT if k in c} if isinstance(c, Mapping) else c
                for c in conditions
            ]
        out["status"] = slim
    return out


def _pod_record(body: Body) -> PodRecord | None:
    meta = body.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    consumer_name = annotations.get(CONSUME_ANNOTATION) or annotations.get(
        DEPRECATED_CONSUME_ANNOTATION
    )
    if not consumer_name and (group := group_of(body)):
        # A gang PodGroup's pod consumes the one request Muster makes for its group.
        consumer_name = gang_request_name(group)
    consumer = f"{meta.get('namespace')}/{consumer_name}" if consumer_name else None
    try:
        pod = Pod.model_validate(body)
        requests = pod_requests(pod.spec)
    except (ValidationError, ValueError) as exc:
        log.warning("ignoring malformed Pod %s: %s", object_key(body), exc)
        return None
    aff = pod.spec.affinity
    # 100,000 records: their strings shared with equal ones (node names, namespaces, label
    # keys and values), and equal request vectors held once.
    node = pod.spec.node_name
    labels = pod.metadata.labels
    return PodRecord(
        node=sys.intern(node) if node else None,
        requests=_shared_requests(requests),
        holds=pod.holds_capacity,
        consumer=consumer,
        namespace=sys.intern(pod.metadata.namespace or "default"),
        labels={sys.intern(k): sys.intern(v) for k, v in labels.items()} if labels
        else _NO_LABELS,
        anti_affinity=tuple(aff.pod_anti_affinity.required)
        if aff and aff.pod_anti_affinity else (),
    )


_NO_LABELS: Mapping[str, str] = MappingProxyType({})
SHARED_REQUESTS = 4096
"""Distinct request vectors held once (pods of one workload ask for the same); beyond this
many, new ones are kept per pod."""
_requests_seen: dict[tuple[tuple[str, int], ...], Mapping[str, int]] = {}


def _shared_requests(requests: Mapping[str, int]) -> Mapping[str, int]:
    key = tuple(sorted(requests.items()))
    found = _requests_seen.get(key)
    if found is not None:
        return found
    frozen = MappingProxyType(dict(requests))
    if len(_requests_seen) < SHARED_REQUESTS:
        _requests_seen[key] = frozen
    return frozen
