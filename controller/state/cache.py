"""The cluster cache and the one Snapshot per planning pass built from it.

:class:`ClusterState` composes three parts, fed by list-then-watch loops
(:mod:`controller.state.feeds`) and by the reconciler's own writes:

- the object store (:mod:`controller.state.object_store`, ``state.objects``): Nodes, Pods,
  PodTemplates and ProvisioningRequests with their indexes;
- the pool registry (:mod:`controller.state.pool_registry`, ``state.pool_registry``):
  CapacityPools, those being deleted or refused, and the caps on their headroom;
- the booking ledger (:mod:`controller.state.ledger`, ``state.ledger``): every request's
  booking, and the acquisitions being released.

It keeps what spans them: the watch entry points (an event changes one part and wakes the
requests and bookings another part says it concerns), what requests wait for, the figures
that read all three (booked nodes, tenancy usage, a pool in use) and :meth:`snapshot`. It
owns no I/O and no clock; it is single-threaded asyncio state, so no lock is needed between
the watch callbacks and :meth:`ClusterState.snapshot`.

Bookings come from two places: the ``muster.dev/plan`` annotation of requests in phase
Acquiring/Booked (survives restarts), and :meth:`BookingLedger.reserve` for a plan the
planner just made and is about to persist, so that the next request planned a millisecond
later already sees the capacity as taken.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from controller.api.node import Node
from controller.common.conditions import ConditionType
from controller.common.topology_defaults import KEY_LABEL, POOL_LABEL
from controller.fit import apply_plan
from controller.fit.capacity import BookedMemo
from controller.fit.types import NodeState, Plan, Snapshot
from controller.lifecycle import Phase
from controller.state.bookings import Booking, effective_plan, merge_plans
from controller.state.dra import DraState
from controller.state.ledger import BookingLedger
from controller.state.object_store import Body, ObjectStore, Present, object_key
from controller.state.pool_registry import PoolRegistry, ReservedCapacity
from controller.state.requests import RequestRecord
from controller.state.tenancy import Usage, gpus_of, pool_node

log = logging.getLogger(__name__)

ACTIVE_PHASES = frozenset({Phase.ACQUIRING, Phase.BOOKED})


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
        self.objects = ObjectStore()
        """Nodes, Pods, PodTemplates, ProvisioningRequests (see
        :mod:`controller.state.object_store`)."""
        self.pool_registry = PoolRegistry(self.objects, self.levels)
        """CapacityPools and their headroom (see :mod:`controller.state.pool_registry`)."""
        self.ledger = BookingLedger()
        """Live bookings, releases in flight, acquisitions running (see
        :mod:`controller.state.ledger`)."""
        self.dra = DraState(on_event=self.arrived)
        """DRA objects (ResourceSlices, claims, classes, claim templates)."""
        self._held_cache: dict[str, tuple[Booking, tuple[Any, ...], Plan, tuple[str, ...]]] = {}
        self._booked_memo: BookedMemo = {}
        """Nodes with their bookings applied, reused across passes (apply_plan's memo)."""
        self._plannable: tuple[tuple[NodeState, ...], frozenset[str],
                               tuple[NodeState, ...]] | None = None
        """(the store's node states, the pools being deleted, the node states with those
        pools' nodes unschedulable): rebuilt when either of the first two changes."""
        self._waiting: dict[str, set[str]] = {}
        """``Kind key`` (or a bare kind: any of it) -> requests waiting for it to arrive."""
        self._waits: dict[str, set[str]] = {}
        """Request key -> what it waits for (the inverse of ``_waiting``)."""
        self.synced: dict[str, asyncio.Event] = {
            kind: asyncio.Event() for kind in ("nodes", "pods", "podtemplates", "pools", "requests")
        }
        self.relists: dict[str, Relist] = {
            "nodes": Relist(self.objects.node_names, self.upsert_node, self.delete_node,
                            self.synced["nodes"].set),
            "pods": Relist(self.objects.pod_keys, self.upsert_pod, self.delete_pod,
                           self.synced["pods"].set),
            "requests": Relist(self.objects.request_keys, self.upsert_request,
                               self.delete_request, self.synced["requests"].set),
        }
        """The kinds large enough to be listed page by page (see :class:`Relist`)."""

    # ------------------------------------------------------------------ nodes

    def replace_nodes(self, items: Iterable[Body]) -> None:
        self.relists["nodes"].page(items, first=True, last=True)

    def upsert_node(self, body: Body) -> None:
        stored = self.objects.put_node(body)
        if stored is None:
            return
        old, node = stored
        name = node.metadata.name
        labels = node.metadata.labels
        # Pool headroom counts nodes by labels; heartbeats (status only) leave it as it is.
        if old is None or old.metadata.labels != labels:
            self.pool_registry.nodes_changed()
        if old is None:
            self.arrived(f"Node {name}")
            self.capacity_changed("node added")
        else:
            if old.metadata.labels != labels or _schedulability(old) != _schedulability(node):
                self.capacity_changed("node changed")
            self._recheck_bookings_on(old, node)

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
        old = self.objects.remove_node(name)
        if old is None:
            return
        self.pool_registry.nodes_changed()
        self.capacity_changed("node deleted")
        # A booking's new nodes are known by their providerIDs (or, in a booking persisted
        # before the provider answered, by their acquisition key's label).
        provider_id = old.spec.provider_id
        acquisition = old.metadata.labels.get(KEY_LABEL)
        for key, booking in self.ledger.bookings().items():
            if (name in booking.existing_nodes or name in booking.acquired_nodes
                    or (provider_id and provider_id in booking.acquired_provider_ids)
                    or any(g.key == acquisition for g in booking.groups)):
                self.notify(key)

    def prune_vanished(self, now: datetime) -> None:
        """Forget deleted-node records of keys no active booking holds, the namespaces of
        deleted requests none of whose nodes is left, and the uids of requests deleted long
        before ``now`` (keeps memory flat; see :meth:`ObjectStore.prune`)."""
        self.objects.prune(now, {g.key for b in self.ledger.bookings().values()
                                 for g in b.groups})

    # ------------------------------------------------------------------ pods

    def replace_pods(self, items: Iterable[Body]) -> None:
        self.relists["pods"].page(items, first=True, last=True)

    def upsert_pod(self, body: Body) -> None:
        old, record = self.objects.put_pod(body)
        if old is not None and old.holds and old.node and not (
                record is not None and record.holds and record.node == old.node):
            self.capacity_changed("pod finished")
        if record is not None and record.consumer:
            self.notify(record.consumer)

    def delete_pod(self, key: str) -> None:
        record = self.objects.remove_pod(key)
        if record is not None and record.holds and record.node:
            self.capacity_changed("pod deleted")
        if record is not None and record.consumer:
            self.notify(record.consumer)

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

    # ------------------------------------------------------------------ templates

    def replace_templates(self, items: Iterable[Body]) -> None:
        self.objects.clear_templates()
        for item in items:
            self.upsert_template(item, notify=False)
        self.synced["podtemplates"].set()
        # A relist may have missed deletions and edits: every booking re-checks, once.
        for key in self.ledger.persisted_keys():
            self.notify(key)

    def upsert_template(self, body: Body, *, notify: bool = True) -> None:
        key = self.objects.put_template(body)
        self.arrived(f"PodTemplate {key}")
        if notify:
            self._notify_bookings_of(key)

    def delete_template(self, key: str) -> None:
        self.objects.remove_template(key)
        self._notify_bookings_of(key)

    def _notify_bookings_of(self, template_key: str) -> None:
        """Requests holding a booking planned from this template re-check it."""
        namespace, _, name = template_key.partition("/")
        for key in self.ledger.persisted_keys():
            if not key.startswith(f"{namespace}/"):
                continue
            record = self.objects.request(key)
            if record is not None and name in record.template_names:
                self.notify(key)

    # ------------------------------------------------------------------ pools

    def replace_pools(self, items: Iterable[Body]) -> None:
        errors = self.pool_registry.clear()
        for item in items:
            self.upsert_pool(item, known_errors=errors)
        self.synced["pools"].set()

    def upsert_pool(
        self, body: Body, *, known_errors: Mapping[str, tuple[str, ...]] | None = None
    ) -> None:
        change = self.pool_registry.put(body, known_errors=known_errors)
        if change.spec:
            self.capacity_changed("pool changed")
        if change.model:
            self.arrived(f"CapacityPool {(body.get('metadata') or {}).get('name')}")

    def delete_pool(self, name: str) -> None:
        self.pool_registry.remove(name)

    def set_pool_unusable(self, name: str, problems: Sequence[str]) -> None:
        """The provider refuses pool ``name``'s parameters (``problems``; empty: it accepts
        them): the planner leaves the pool out until they are fixed."""
        if self.pool_registry.set_unusable(name, problems):
            self.capacity_changed("pool usable")

    def mark_short(
        self, pool: str, domain: Mapping[str, str], *, available: int, until: datetime
    ) -> None:
        """The provider ran out of stock in ``domain`` (see :meth:`PoolRegistry.mark_short`);
        the waiting requests are woken when the window ends."""
        if self.pool_registry.mark_short(pool, domain, available=available, until=until):
            self.shortage_set(until)

    def set_pool_reservation(
        self, pool: str, reserved: Sequence[ReservedCapacity] | None
    ) -> None:
        """Pool ``pool`` draws only from the reservations ``reserved`` (None: it names
        none), as the cloud counted them just now (see
        :meth:`PoolRegistry.set_reservation`)."""
        self.pool_registry.set_reservation(pool, reserved, held=self._pool_held_nodes(pool))

    def _pool_held_nodes(self, pool: str) -> int:
        """Machines of ``pool`` the cloud counts as running: its registered nodes, and the
        ones a booking's acquisition launched that have not registered yet."""
        held = self.objects.pool_node_count(pool)
        for booking in self.ledger.bookings().values():
            for group in booking.groups:
                if group.pool == pool and group.provider_ids:
                    held += max(0, len(group.provider_ids) - len(self.objects.registered(group)))
        return held

    def pool_in_use(self, name: str) -> bool:
        """Nodes of the pool exist, or an acquisition through it runs: its finalizer must
        stay, since releasing those nodes needs the pool's provider settings."""
        return self.objects.pool_node_count(name) > 0 or self.ledger.acquiring(name)

    # ------------------------------------------------------------------ requests, bookings

    def replace_requests(self, items: Iterable[Body]) -> None:
        self.relists["requests"].page(items, first=True, last=True)

    def upsert_request(self, body: Body) -> RequestRecord | None:
        """Parse and store ``body`` unless an equal or newer version is held, or the request
        was seen deleted; the stored record, None when not stored."""
        key = object_key(body)
        meta = body.get("metadata") or {}
        uid = meta.get("uid")
        if uid and self.objects.seen_deleted(uid):
            return None
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # Deleting with no finalizer left: gone from the API server already (the answer
            # to the write that removed the last finalizer says so before the watch does).
            self.delete_request(key, uid=uid)
            return None
        stored = self.objects.put_request(key, body)
        if stored is None:
            return None
        old, record = stored
        had_booking = self.ledger.persisted(key)
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
        self.objects.remove_request(key, uid=uid)
        self.wait_for(key, ())
        if self.ledger.drop(key):
            self.capacity_changed("request deleted")
        self.forget(key)

    def booked_nodes(self, *, exclude: str | None = None) -> frozenset[str]:
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
                out.update(self.objects.group_node_names(group))
                out.update(self.objects.acquired_nodes(group.key))
        return frozenset(out)

    def booked_provider_ids(self) -> frozenset[str]:
        """providerIDs of the machines every live booking's acquisitions launched."""
        return frozenset(p for booking in self.ledger.bookings().values()
                         for p in booking.acquired_provider_ids)

    # ------------------------------------------------------------------ tenancy

    def plan_usage(self, groups: Iterable[tuple[str, int]]) -> Usage:
        """What new nodes ``(pool, count)`` would add to a namespace's usage."""
        total = Usage()
        for pool, count in groups:
            total = total + pool_node(self.pool_registry.pool(pool)).times(count)
        return total

    def namespace_usage(self, namespace: str) -> Usage:
        """What the requests of ``namespace`` hold now (see :mod:`controller.state.tenancy`):
        their live bookings' planned new nodes, plus nodes acquired for them that no live
        booking holds. Reservations made earlier in the same planning pass count, so a
        burst of requests cannot jointly exceed a limit."""
        prefix = f"{namespace}/"
        held: set[str] = set()
        total = Usage()
        pools = self.pool_registry
        for key, booking in self.ledger.bookings().items():
            if not key.startswith(prefix):
                continue
            for group in booking.groups:
                held.add(group.key)
                total = total + pool_node(pools.pool(group.pool)).times(group.count)
        for key in self.objects.acquisition_keys():
            if key in held:
                continue
            for name in self.objects.acquired_nodes(key):
                node = self.objects.node(name)
                if node is None or self.objects.node_namespace(key, node) != namespace:
                    continue
                pool = pools.pool(node.metadata.labels.get(POOL_LABEL, ""))
                price = pool.spec.price_per_node_hour if pool is not None else 0.0
                total = total + Usage(1, gpus_of(node.allocatable()), price)
        return total

    # ------------------------------------------------------------------ snapshot

    def _held(self, key: str, booking: Booking) -> Plan:
        """:func:`effective_plan` of one booking, memoised on exactly what it depends on
        (the booking, its consumers, its keys' registered nodes, its named nodes), so a
        planning pass costs O(changed bookings), not O(all bookings)."""
        consumers = self.objects.scheduled_consumers(key)
        cached = self._held_cache.get(key)
        if cached is not None and cached[0] is not booking:
            cached = None  # another booking: nothing of the memo applies
        named = cached[3] if cached is not None else _nodes_named(booking)
        objects = self.objects
        registered = {g.key: objects.registered(g) for g in booking.groups}
        signature = (
            tuple(sorted(consumers.items())) if consumers else (),
            tuple([registered[g.key] for g in booking.groups]),
            tuple([objects.node_exists(n) for n in named]),
        )
        if cached is not None and cached[1] == signature:
            return cached[2]
        plan = effective_plan(
            booking,
            existing=Present(objects.nodes()),
            scheduled_on=consumers,
            nodes_by_key=registered,
        )
        self._held_cache[key] = (booking, signature, plan, named)
        return plan

    def _unconfirmed_off(self, nodes: tuple[NodeState, ...], bookings: Mapping[str, Booking],
                         exclude: str | None) -> tuple[NodeState, ...]:
        """``nodes`` with those of acquisitions not yet confirmed (Provisioned=True not yet
        written) or being released made unschedulable for others: such an acquisition may
        still be rolled back (a failure, nodes not Ready in time, a resumed attempt that
        fails), deleting its nodes under whoever booked their spare capacity meanwhile."""
        blocked: set[str] = set()
        for releasing in self.ledger.releasing_keys():
            blocked.update(self.objects.acquired_nodes(releasing))
        for key in self.ledger.released_keys():
            left = self.objects.acquired_nodes(key)
            if left:
                blocked.update(left)
            else:
                self.ledger.forget_released((key,))
        for key, booking in bookings.items():
            if key == exclude or not booking.groups or _confirmed(self.objects.request(key)):
                continue
            for group in booking.groups:
                blocked.update(self.objects.acquired_nodes(group.key))
                blocked.update(self.objects.registered(group))
        if not blocked:
            return nodes
        return tuple(replace(n, schedulable=False) if n.name in blocked and n.schedulable
                     else n for n in nodes)

    def _plannable_nodes(self) -> tuple[NodeState, ...]:
        """Every node's state, those of pools being deleted unschedulable."""
        states = self.objects.node_states()
        deleting = self.pool_registry.deleting_names()
        cached = self._plannable
        if cached is not None and cached[0] is states and cached[1] == deleting:
            return cached[2]
        out = tuple(replace(n, schedulable=False) if n.pool in deleting else n for n in states)
        self._plannable = (states, deleting, out)
        return out

    def snapshot(self, *, exclude: str | None = None, now: datetime | None = None,
                 with_unusable: bool = False) -> Snapshot:
        """The fit engine's view: free capacity minus every booking but ``exclude``'s, and
        pool headroom capped where the provider recently ran out of stock (as of ``now``).

        ``with_unusable``: also the pools the provider refuses, as they would be once fixed
        (to tell a request which of them would serve it; never to plan on)."""
        pools = self.pool_registry.states(now=now, with_unusable=with_unusable)
        bookings = self.ledger.bookings()
        nodes_now, pools_now = self.dra.attach(
            self._unconfirmed_off(self._plannable_nodes(), bookings, exclude), pools,
            list(self.pool_registry.pools().values())
        )
        snap = Snapshot(nodes=nodes_now, pools=pools_now, levels=self.levels)
        plans = [self._held(key, b) for key, b in bookings.items() if key != exclude]
        if len(self._held_cache) > 2 * len(bookings) + 64:
            self._held_cache = {k: v for k, v in self._held_cache.items() if k in bookings}
        merged = merge_plans(plans)
        if merged is None:
            return snap
        nodes = self.objects.nodes()
        if len(self._booked_memo) > 2 * len(nodes) + 64:
            self._booked_memo = {k: v for k, v in self._booked_memo.items() if k in nodes}
        return apply_plan(snap, merged, memo=self._booked_memo)


def _schedulability(node: Node) -> tuple[Any, ...]:
    """What of a node decides whether pods can go to it, beside its labels: readiness,
    start-up and other taints, cordoning, allocatable."""
    return (node.usable, node.spec.unschedulable, node.spec.taints, node.allocatable())


def _confirmed(record: RequestRecord | None) -> bool:
    """Provisioned=True: the booking's acquisition is over and will not be rolled back."""
    return record is not None and record.condition_true(ConditionType.PROVISIONED)


def _nodes_named(booking: Booking) -> tuple[str, ...]:
    return (*booking.existing_nodes, *booking.acquired_nodes)
