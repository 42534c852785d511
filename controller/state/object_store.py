"""The watch-fed object store: Nodes, Pods, PodTemplates and ProvisioningRequests as the API
server last told them, with the indexes the planner reads them by.

:class:`ObjectStore` keeps each object (Nodes slimmed, Pods reduced to what counts against
their node) and its indexes: nodes by acquisition key, by providerID and by pool, the
requests of bound pods summed per node (kept incrementally, so 100,000 pods cost nothing per
pass), the pods consuming each request, and the uids of requests seen deleted. It reacts to
nothing: its ``put_*`` and ``remove_*`` methods say what they replaced, and
:class:`controller.state.cache.ClusterState` turns that into wake-ups and booking checks.
What it hands out is read-only (mapping views, frozensets, tuples).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from controller.api.node import Node
from controller.api.pod import Pod, PodAffinityTerm, PodTemplate
from controller.common.topology_defaults import KEY_LABEL, OWNER_ANNOTATION, POOL_LABEL
from controller.fit.types import NodeState
from controller.inputs.constraints import BoundPod
from controller.inputs.podgroup_membership import group_of
from controller.inputs.podgroup_membership import request_name as gang_request_name
from controller.inputs.snapshot import node_state, pod_requests
from controller.state.bookings import Group
from controller.state.requests import RequestRecord
from controller.state.tenancy import owner_uid_of_key

log = logging.getLogger(__name__)

Body = dict[str, Any]

CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
DEPRECATED_CONSUME_ANNOTATION = "cluster-autoscaler.kubernetes.io/consume-provisioning-request"

DELETED_SECONDS = 300.0
"""How long a deleted request's uid is remembered: between this and twice this (two
generations, turned over by :meth:`ObjectStore.prune`), five times the longest a write or a
list can be in flight (the client's timeout is 60 s). Kept by age rather than count so that
a steady stream of requests keeps a steady number of uids: a bound by count alone lets
memory grow for hours before it is reached (docs/benchmarks/soak.md)."""
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


@dataclass(frozen=True, slots=True)
class TemplateError:
    """A PodTemplate the model refuses: ``detail`` names the first bad field."""

    detail: str


_LAST = datetime.max.replace(tzinfo=UTC)


class ObjectStore:
    """Nodes, Pods, PodTemplates and ProvisioningRequests with their indexes. No I/O, no
    clock; single-threaded asyncio state."""

    def __init__(self) -> None:
        self._nodes: dict[str, Node] = {}
        self._nodes_by_key: dict[str, set[str]] = {}
        """Acquisition key (the node's key label) -> its nodes."""
        self._nodes_by_pool: dict[str, set[str]] = {}
        """CapacityPool name (the node's pool label) -> its nodes."""
        self._node_by_provider_id: dict[str, str] = {}
        """``spec.providerID`` -> node name: how an acquisition's nodes are known."""
        self._provider_id_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._ready_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._gone_by_key: dict[str, set[str]] = {}
        self._node_states: dict[str, NodeState] = {}
        self._sorted_nodes: tuple[NodeState, ...] | None = None
        self._usage: dict[str, dict[str, int]] = {}
        self._pods: dict[str, PodRecord] = {}
        self._repellers: set[str] = set()
        """Pods with required anti-affinity terms (they repel other pods)."""
        self._consumed: dict[str, dict[str, int]] = {}
        self._pods_on: dict[str, int] = {}
        self._templates: dict[str, PodTemplate] = {}
        self._template_errors: dict[str, TemplateError] = {}
        self._requests: dict[str, RequestRecord] = {}
        self._arrivals: dict[str, int] = {}
        """Request key -> the order the store first saw it in (ties of creationTimestamp,
        which has one-second resolution)."""
        self._arrived = 0
        self._uid_namespace: dict[str, str] = {}
        """Request uid -> namespace, kept after a deletion while nodes acquired for the
        request exist (they still count against the namespace's limits)."""
        self._deleted: OrderedDict[str, None] = OrderedDict()
        """uids of requests seen deleted since ``_deleted_turned``, newest last: an answer to
        a write sent before the deletion must not bring the request back."""
        self._deleted_before: OrderedDict[str, None] = OrderedDict()
        """The generation before (see :data:`DELETED_SECONDS`)."""
        self._deleted_turned: datetime | None = None

    # ------------------------------------------------------------------ nodes

    def put_node(self, body: Body) -> tuple[Node | None, Node] | None:
        """Store the Node ``body``: (the node it replaced, the node stored); None when the
        model refuses it (it is ignored)."""
        try:
            node = Node.model_validate(_slim_node(body))
        except ValidationError as exc:
            log.warning("ignoring malformed Node %s: %s", object_key(body), exc)
            return None
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
        if node.settled:
            for fut in self._ready_waiters.pop(name, []):
                if not fut.done():
                    fut.set_result(None)
        return old, node

    def remove_node(self, name: str) -> Node | None:
        """Forget node ``name``; the node it held (None: none)."""
        self._unindex(name, gone=True)
        old = self._nodes.pop(name, None)
        if old is None:
            return None
        self._node_states.pop(name, None)
        self._sorted_nodes = None
        provider_id = old.spec.provider_id
        if provider_id:
            if self._node_by_provider_id.get(provider_id) == name:
                del self._node_by_provider_id[provider_id]
            self._wake(provider_id)
        self._wake(name)
        return old

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

    def _wake(self, provider_id: str) -> None:
        for fut in list(self._provider_id_waiters.get(provider_id, ())):
            if not fut.done():
                fut.set_result(None)

    def node_names(self) -> list[str]:
        return list(self._nodes)

    def node(self, name: str) -> Node | None:
        return self._nodes.get(name)

    def node_exists(self, name: str) -> bool:
        return name in self._nodes

    def node_ready(self, name: str) -> bool:
        """Ready and settled (no start-up taint left): pods can be placed on it now."""
        node = self._nodes.get(name)
        return node is not None and node.settled

    def nodes(self) -> Mapping[str, Node]:
        """Every node by name (a read-only view)."""
        return MappingProxyType(self._nodes)

    def node_states(self) -> tuple[NodeState, ...]:
        """The fit engine's picture of every node with readable allocatable, by name (the
        same tuple until a node or a pod on one changes)."""
        if self._sorted_nodes is None:
            self._sorted_nodes = tuple(self._node_states[n] for n in sorted(self._node_states))
        return self._sorted_nodes

    def acquisition_keys(self) -> list[str]:
        """The acquisition keys some registered node carries."""
        return list(self._nodes_by_key)

    def acquired_nodes(self, key: str) -> tuple[str, ...]:
        """The registered nodes carrying acquisition key ``key``, sorted."""
        return tuple(sorted(self._nodes_by_key.get(key, ())))

    def pool_nodes(self, pool: str) -> list[Node]:
        """The nodes carrying pool ``pool``'s label."""
        return [self._nodes[n] for n in self._nodes_by_pool.get(pool, ())]

    def pool_node_count(self, pool: str) -> int:
        return len(self._nodes_by_pool.get(pool, ()))

    def vanished(self, key: str) -> list[str]:
        """Nodes of acquisition ``key`` seen deleted since this process started."""
        return sorted(self._gone_by_key.get(key, ()))

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
        return self.acquired_nodes(group.key)

    def registered(self, group: Group) -> tuple[str, ...]:
        """The group's nodes Muster registered (found by providerID and carrying the pool's
        label, so the pool's node count includes them), else by the acquisition-key label.
        A node that appeared but is not registered yet stays booked as a new node."""
        if group.provider_ids:
            return tuple(n for n in self.group_node_names(group)
                         if self._nodes[n].metadata.labels.get(POOL_LABEL) == group.pool)
        return self.acquired_nodes(group.key)

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

    def put_pod(self, body: Body) -> tuple[PodRecord | None, PodRecord | None]:
        """Store the Pod ``body``: (the record it replaced, the record stored; None when
        the pod is malformed, and then only the old record is forgotten)."""
        key = object_key(body)
        record = _pod_record(body)
        old = self.remove_pod(key)
        if record is None:
            return old, None
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
        return old, record

    def remove_pod(self, key: str) -> PodRecord | None:
        """Forget pod ``key``; the record it held (None: none)."""
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

    def pod_keys(self) -> list[str]:
        return list(self._pods)

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
        """Node -> bound pods consuming ``request_key`` (``<ns>/<name>``), a read-only view."""
        found = self._consumed.get(request_key)
        return MappingProxyType(found) if found else _NO_COUNTS

    def pods_on(self, node: str) -> int:
        """Bound pods still holding capacity on ``node``."""
        return self._pods_on.get(node, 0)

    # ------------------------------------------------------------------ templates

    def clear_templates(self) -> None:
        self._templates.clear()
        self._template_errors.clear()

    def put_template(self, body: Body) -> str:
        """Store the PodTemplate ``body`` (or why the model refuses it); its key."""
        key = object_key(body)
        try:
            self._templates[key] = PodTemplate.model_validate(body)
            self._template_errors.pop(key, None)
        except ValidationError as exc:
            self._templates.pop(key, None)
            self._template_errors[key] = TemplateError(_first_error(exc))
        return key

    def remove_template(self, key: str) -> None:
        self._templates.pop(key, None)
        self._template_errors.pop(key, None)

    def template(self, namespace: str, name: str) -> PodTemplate | TemplateError | None:
        """The parsed template, why it is malformed, or None when missing."""
        key = f"{namespace}/{name}"
        return self._templates.get(key) or self._template_errors.get(key)

    # ------------------------------------------------------------------ requests

    def seen_deleted(self, uid: str) -> bool:
        """A request with ``uid`` was deleted lately (see :data:`DELETED_SECONDS`)."""
        return uid in self._deleted or uid in self._deleted_before

    def put_request(self, key: str, body: Body) -> tuple[RequestRecord | None,
                                                         RequestRecord] | None:
        """Parse and store ``body`` unless an equal or newer version is held: (the record
        it replaced, the record stored); None when not stored."""
        meta = body.get("metadata") or {}
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
        uid = meta.get("uid")
        if uid and meta.get("namespace"):
            self._uid_namespace[str(uid)] = str(meta["namespace"])
        return old, record

    def remove_request(self, key: str, *, uid: str | None = None) -> RequestRecord | None:
        """Forget request ``key``; ``uid`` (else the stored one's) is remembered as deleted.
        The record it held (None: none)."""
        old = self._requests.pop(key, None)
        self._arrivals.pop(key, None)
        uid = uid or (old.uid if old is not None else None)
        if uid:
            self._deleted[uid] = None
            if len(self._deleted) > DELETED_MEMORY:
                self._deleted.popitem(last=False)
        return old

    def request(self, key: str) -> RequestRecord | None:
        return self._requests.get(key)

    def requests(self) -> Mapping[str, RequestRecord]:
        """Every request by key (a read-only view)."""
        return MappingProxyType(self._requests)

    def request_keys(self) -> list[str]:
        return list(self._requests)

    def arrival(self, key: str) -> tuple[datetime, int]:
        """Where ``key`` stands in the order of arrival: its creationTimestamp, then the
        order the store first saw it in (a request not stored sorts last)."""
        record = self._requests.get(key)
        created = record.created_at if record is not None else None
        return (created or _LAST, self._arrivals.get(key, sys.maxsize))

    def node_namespace(self, key: str, node: Node) -> str | None:
        """The namespace of the request ``node`` was acquired for (under acquisition key
        ``key``): the key's uid, else the node's owner annotation (survives a restart after
        the deletion)."""
        found = self._uid_namespace.get(owner_uid_of_key(key))
        if found is not None:
            return found
        owner = node.metadata.annotations.get(OWNER_ANNOTATION, "")
        return owner.partition("/")[0] if "/" in owner else None

    def prune(self, now: datetime, live_keys: Iterable[str]) -> None:
        """Forget deleted-node records of acquisition keys not in ``live_keys``, the
        namespaces of deleted requests none of whose nodes is left, and the uids of requests
        deleted more than :data:`DELETED_SECONDS` before ``now`` (keeps memory flat)."""
        if self._deleted_turned is None:
            self._deleted_turned = now
        elif (now - self._deleted_turned).total_seconds() >= DELETED_SECONDS:
            self._deleted_before, self._deleted = self._deleted, OrderedDict()
            self._deleted_turned = now
        live = set(live_keys)
        for key in [k for k in self._gone_by_key if k not in live]:
            del self._gone_by_key[key]
        held = {owner_uid_of_key(k) for k in self._nodes_by_key}
        held.update(r.uid for r in self._requests.values())
        for uid in [u for u in self._uid_namespace if u not in held]:
            del self._uid_namespace[uid]


_NO_COUNTS: Mapping[str, int] = MappingProxyType({})


class Present(Mapping[str, bool]):
    """Node name -> True for every node in ``nodes``, without copying the dict per pass."""

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
