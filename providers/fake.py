"""The fake provider: an in-process cloud whose machines register their Nodes as kubelet does.

It is a real :class:`providers.base.Provider`, the adapter of the same all-or-nothing
skeleton as the cloud providers (:mod:`providers.atomic`), used by ``muster demo``, the e2e
tests, the benchmark and a kind cluster alike. A launched machine (:class:`FakeMachine`)
boots with the user data the provider rendered for it, as a cloud machine does, and a
kubelet stand-in (:func:`kubelet_node`) registers its Node only from what the machine has:
the name and ``spec.providerID = kind://<pool>/<key>/<i>`` the cloud gives it, the
well-known labels of kubelet and the cloud-controller-manager (hostname, os, arch, the zone
and topology labels of where the cloud put it), the machine's shape (the pool template's
capacity) and the ``--register-with-taints`` of its user data (Muster's startup taint).
Muster's own labels (pool, acquisition, domain, the pool template's labels and taints) are
written by Muster when it registers the node (:mod:`controller.acquire.registration`), as
on a real cloud. The cloud's records of its machines (its "tags": pool, key, owner) are kept
on the Node under ``fake.muster.dev/``, Muster never reads them; :meth:`FakeProvider.list`
finds the machines by them after a restart. A heartbeat task renews each
node's Lease in ``kube-node-lease`` and its Ready condition, so a real node lifecycle
controller keeps them Ready; with ``heartbeat_seconds=0`` that is left to kwok, which
manages every node annotated ``kwok.x-k8s.io/node: fake`` (the real-cluster test tier).

For tests it keeps the things a cloud has and a cluster lacks: stock per domain, acquisition
latency, injected failures (next error, grant k of n); the skeleton deletes a partial
creation before the error is raised, so all-or-nothing holds. Acquisitions and releases are
recorded in :attr:`FakeProvider.calls`.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import logging
import random
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from controller.api.capacitypool import CapacityPool
from controller.common import crashpoints
from controller.common.topology_defaults import UNREGISTERED_TAINT, placeholder
from controller.inputs.dra_templates import render_resource_slices
from controller.inputs.node_labels import ARCH, OS, cloud_facts, node_labels
from controller.kube import ApiError, Body, KubeClient
from controller.kube.resources import LEASES, NAMESPACES, NODES, RESOURCE_SLICES
from providers.atomic import AtomicProvider, Launch
from providers.base import (
    GRANTED,
    QUEUED,
    AcquireRequest,
    CapacityUnavailable,
    ProvidedNode,
    ProviderConfigError,
    ProviderError,
    QueuedStatus,
    QuotaExceeded,
    TransientProviderError,
)
from providers.common import ReservationFigures

log = logging.getLogger(__name__)

PROVIDER_LABEL = "muster.dev/provider"
"""The fake cloud's mark on its machines' Nodes (its name, ``kind``)."""
TAG_POOL = "fake.muster.dev/pool"
TAG_KEY = "fake.muster.dev/key"
TAG_OWNER_UID = "fake.muster.dev/owner-uid"
TAG_OWNER = "fake.muster.dev/owner"
"""The fake cloud's tags of a machine (EC2's instance tags), kept on its Node."""
NODE_LEASE_NAMESPACE = "kube-node-lease"
BOOT_DELAY_ANNOTATION = "muster.dev/boot-delay"
KNOWN_PARAMETERS = frozenset(
    {"stock", "defaultStock", "latencySeconds", "readyDelaySeconds", "faults", "reservation",
     "queue"}
)
FAULT_KINDS = ("stockOut", "quota", "throttle", "timeout", "partial", "releaseError")
"""``parameters.faults``: each a probability (0-1) drawn per call; ``seed`` makes the draws
repeatable, ``timeoutSeconds`` is how long a timed-out call hangs (default 2):

* ``stockOut``: the acquire finds no stock (CapacityUnavailable, retryable, nothing created);
* ``quota``: QuotaExceeded (not retryable: the request fails);
* ``throttle``: the cloud throttles (ProviderUnavailable, retryable, nothing created);
* ``timeout``: the nodes are created but the answer never comes (ProviderUnavailable after
  ``timeoutSeconds``): the caller must roll back what it cannot see;
* ``partial``: k of n nodes are granted (k drawn in 0..n-1), rolled back, CapacityUnavailable;
* ``releaseError``: a release fails before deleting anything (ProviderUnavailable): someone
  must retry it.

A process's draws for a pool come from one ``random.Random(seed)``; patching the pool's
parameters changes the probabilities at once (the draws go on from where they were)."""
CALLS_KEPT = 1_000
"""The last calls :attr:`FakeProvider.calls` keeps: a long-running controller's must not
grow with every request it ever handled (docs/benchmarks/soak.md). Tests read the last few."""

T = TypeVar("T")
Now = Callable[[], datetime]
Nodes = list[ProvidedNode]
"""Alias: inside the class, ``list`` names the Provider method."""


@dataclass(frozen=True, slots=True)
class ProviderCall:
    op: str
    """acquire | release (the collector's periodic lists are not recorded: nothing reads
    them, and at one per pool per second they would crowd the acquisitions out)"""
    pool: str
    key: str = ""
    count: int = 0
    domain: Mapping[str, str] = field(default_factory=dict)
    outcome: str = "ok"
    """ok | the error's reason"""


@dataclass(slots=True)
class _Queued:
    """A gang in the fake cloud's queue (``parameters.queue: true``)."""

    request: AcquireRequest
    run_seconds: int | None
    ready_within: float
    since: datetime
    granted: bool = False
    ends: datetime | None = None
    """Once granted with a run bound: the end the fake cloud reports, as GCP's MIG would
    delete the VMs ``requestedRunDuration`` after it creates them (the run plus the
    registration budget Muster gave). The fake reports it; it does not delete the nodes."""


@dataclass(slots=True)
class _Injected:
    errors: list[ProviderError] = field(default_factory=list)
    grants: list[int] = field(default_factory=list)
    silent: list[bool] = field(default_factory=list)
    misplaced: list[Mapping[str, str]] = field(default_factory=list)


def domain_key(domain: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(domain.items()))


class FakeProvider(AtomicProvider[ProvidedNode]):
    """Nodes as Node objects, through the all-or-nothing skeleton. Safe to call
    concurrently.

    ``name`` is ``kind``, the provider name pools use (``fake`` is an alias in the registry),
    and the value of the ``muster.dev/provider`` label on its nodes: nodes made by earlier
    versions stay its own.
    """

    name = "kind"
    launch_adopts = True

    def __init__(
        self,
        kube: KubeClient,
        *,
        acquire_latency_seconds: float = 0.0,
        heartbeat_seconds: float = 10.0,
        default_stock: int | None = None,
        now: Now | None = None,
    ) -> None:
        super().__init__()
        self._kube = kube
        self.acquire_latency_seconds = acquire_latency_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.default_stock = default_stock
        self._now = now or (lambda: datetime.now(UTC))
        self.calls: deque[ProviderCall] = deque(maxlen=CALLS_KEPT)
        self._stock: dict[tuple[str, str], int] = {}
        self._injected: dict[str, _Injected] = defaultdict(_Injected)
        self._launched: set[str] = set()
        """Keys whose last acquire launched (for :attr:`calls`)."""
        self._stock_locks: dict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self._owned: set[str] = set()
        self._since: dict[str, str] = {}
        self._silent: dict[tuple[str, str], list[ProvidedNode]] = {}
        """(pool, key) -> machines that never registered (:meth:`never_register_next`)."""
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._fault_rngs: dict[str, random.Random] = {}
        self._queue: dict[tuple[str, str], _Queued] = {}
        self._refused_cancels: dict[str, ProviderError] = {}
        """(pool, key) -> a gang waiting in (or granted by) the queue of a queue pool."""

    # ------------------------------------------------------------------ test controls

    def set_stock(self, pool: str, domain: Mapping[str, str], nodes: int) -> None:
        """Limit how many nodes of ``pool`` may exist in ``domain`` (a cloud's stock)."""
        self._stock[(pool, domain_key(domain))] = nodes

    def fail_next(self, error: ProviderError, *, pool: str = "*") -> None:
        """The next launch (of ``pool``, or of any pool) raises ``error`` without creating."""
        self._injected[pool].errors.append(error)

    def grant_next(self, nodes: int, *, pool: str = "*") -> None:
        """The next launch creates only ``nodes`` nodes; the skeleton must delete them and
        fail."""
        self._injected[pool].grants.append(nodes)

    def misplace_next(self, placement: Mapping[str, str], *, pool: str = "*") -> None:
        """The next launch's machines are put in ``placement`` (topology labels), not in
        the requested domain, as a cloud may when a placement group is full."""
        self._injected[pool].misplaced.append(dict(placement))

    def refuse_cancels(self, pool: str, error: ProviderError | None) -> None:
        """Every :meth:`cancel_queued` of ``pool`` raises ``error`` and leaves the gang in
        the queue, as a cloud refusing the cancel does, until called with None."""
        if error is None:
            self._refused_cancels.pop(pool, None)
        else:
            self._refused_cancels[pool] = error

    def never_register_next(self, *, pool: str = "*") -> None:
        """The next launch's machines boot but never register a Node (a broken bootstrap):
        the cloud holds them (:meth:`list` shows them) until they are released. Such
        machines live only in this process's memory (the fake cloud keeps its other
        machines as their Nodes)."""
        self._injected[pool].silent.append(True)

    # ------------------------------------------------------------------ Provider

    async def validate(self, pool: CapacityPool) -> None:
        params = pool.spec.parameters
        unknown = set(params) - KNOWN_PARAMETERS
        if unknown:
            raise ProviderConfigError(
                f"pool {pool.metadata.name}: unknown fake provider parameter(s) "
                f"{sorted(unknown)}; known: {sorted(KNOWN_PARAMETERS)}"
            )
        for name in ("defaultStock", "latencySeconds", "readyDelaySeconds"):
            value = params.get(name)
            if value is not None and (not isinstance(value, int | float) or value < 0):
                raise ProviderConfigError(
                    f"pool {pool.metadata.name}: parameters.{name} must be a number >= 0, "
                    f"got {value!r}"
                )
        _validate_faults(pool.metadata.name, params.get("faults"))
        if not isinstance(params.get("queue", False), bool):
            raise ProviderConfigError(
                f"pool {pool.metadata.name}: parameters.queue must be true or false, got "
                f"{params.get('queue')!r}"
            )
        try:
            _reservation(pool)
        except (TypeError, ValueError, KeyError) as exc:
            raise ProviderConfigError(
                f"pool {pool.metadata.name}: parameters.reservation must be {{id: <str>, "
                f"nodes: <int>, start?: <RFC 3339>, end?: <RFC 3339>}} ({exc})"
            ) from None
        for i, entry in enumerate(params.get("stock") or []):
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("labels"), dict)
                or not isinstance(entry.get("nodes"), int)
            ):
                raise ProviderConfigError(
                    f"pool {pool.metadata.name}: parameters.stock[{i}] must be "
                    "{labels: {...}, nodes: <int>}"
                )

    async def reservations(self, pool: CapacityPool) -> builtins.list[ReservationFigures]:
        """``parameters.reservation`` ({id, nodes, start?, end?}) as a cloud would report
        it: ``nodes`` reserved, used by the pool's nodes that exist."""
        held = _reservation(pool)
        if held is None:
            return []
        rid, size, start, end = held
        used = await self._pool_node_count(pool)
        return [ReservationFigures(id=rid, zone="", reserved=size, free=max(0, size - used),
                                   state="active", start=start, end=end)]

    # ------------------------------------------------------------------ the queue

    def queues(self, pool: CapacityPool) -> bool:
        """A pool with ``parameters.queue: true`` has a queue: a gang waits in it until the
        pool's stock holds all of it, then gets every node at once (all or nothing)."""
        return pool.spec.parameters.get("queue") is True

    async def enqueue(self, request: AcquireRequest, run_seconds: int | None, *,
                      ready_within: float) -> QueuedStatus:
        pool = request.pool
        if not self.queues(pool):
            raise ProviderConfigError(f"pool {pool.metadata.name}: parameters.queue is not set")
        slot = (pool.metadata.name, request.key)
        if slot not in self._queue:
            self._queue[slot] = _Queued(request, run_seconds, ready_within, self._now())
            self._record("enqueue", request, "queued")
        found = await self.queued(pool, request.key)
        assert found is not None
        return found

    async def queued(self, pool: CapacityPool, key: str) -> QueuedStatus | None:
        """The key's place; asking is when the fake queue looks at its stock again and
        grants the gang if all of it fits now."""
        entry = self._queue.get((pool.metadata.name, key))
        if entry is None:
            return None
        if not entry.granted:
            await self._grant(pool, entry)
        return QueuedStatus(
            name=f"queue/{key}", state="GRANTED" if entry.granted else "WAITING",
            outcome=GRANTED if entry.granted else QUEUED,
            since=entry.since.isoformat().replace("+00:00", "Z"),
            ends=entry.ends.isoformat().replace("+00:00", "Z") if entry.ends else "",
        )

    async def cancel_queued(self, pool: CapacityPool, key: str) -> str | None:
        refused = self._refused_cancels.get(pool.metadata.name)
        if refused is not None and (pool.metadata.name, key) in self._queue:
            raise refused
        entry = self._queue.pop((pool.metadata.name, key), None)
        if entry is None:
            return None
        self._record("cancel", entry.request, "granted" if entry.granted else "cancelled")
        return f"queued request queue/{key} was taken out of the queue"

    async def _grant(self, pool: CapacityPool, entry: _Queued) -> None:
        request = replace(entry.request, pool=pool)
        async with self._locked(request.key), self.guard(request):
            if await self._allowed(pool, request, None) < request.count:
                return
            names = [_node_name(pool.metadata.name, request.key, i)
                     for i in range(request.count)]
            try:
                await asyncio.gather(*(self._create_node(pool, request, n) for n in names))
            except ApiError as exc:
                await self.delete(pool, request.key, ())
                log.warning("fake queue: granting %s failed (%s); it stays queued",
                            request.key, exc)
                return
            entry.granted = True
            if entry.run_seconds is not None:
                entry.ends = self._now() + timedelta(
                    seconds=entry.run_seconds + entry.ready_within)
            self._record("grant", request, "granted")

    async def _pool_node_count(self, pool: CapacityPool) -> int:
        selector = f"{PROVIDER_LABEL}={self.name},{TAG_POOL}={pool.metadata.name}"
        listing = await self._kube.list(NODES, label_selector=selector)
        return len(listing.get("items") or [])

    async def acquire(self, request: AcquireRequest) -> Nodes:
        """The skeleton's acquire, recorded in :attr:`calls` ("reused": nothing created,
        the key's nodes were there already, as after a crash or a timeout)."""
        self._launched.discard(request.key)
        # The cloud's latency, outside the skeleton's per-domain guard: acquisitions in one
        # domain take their time side by side, as a cloud's do.
        latency = float(request.pool.spec.parameters.get("latencySeconds", 0.0))
        latency = latency or self.acquire_latency_seconds
        try:
            if latency:
                await asyncio.sleep(latency)
            nodes = await super().acquire(request)
        except ProviderError as exc:
            self._record("acquire", request, exc.reason)
            raise
        launched = request.key in self._launched
        self._launched.discard(request.key)
        self._record("acquire", request, "ok" if launched else "reused")
        return nodes

    async def release(self, pool: CapacityPool, key: str) -> int:
        if self._draw(pool, "releaseError"):
            self.calls.append(ProviderCall("release", pool.metadata.name, key, 0,
                                           outcome="ProviderUnavailable"))
            raise TransientProviderError(
                f"pool {pool.metadata.name}: releasing {key} failed (injected fault); "
                "nothing was deleted"
            )
        deleted = await super().release(pool, key)
        self.calls.append(ProviderCall("release", pool.metadata.name, key, deleted))
        return deleted

    # ------------------------------------------------------------------ the adapter

    async def find(self, pool: CapacityPool, key: str | None) -> Nodes:
        selector = f"{PROVIDER_LABEL}={self.name},{TAG_POOL}={pool.metadata.name}"
        if key is not None:
            selector += f",{TAG_KEY}={key}"
        listing = await self._kube.list(NODES, label_selector=selector)
        found = [_provided(n) for n in listing.get("items") or []]
        found += [m for (p, k), machines in self._silent.items()
                  if p == pool.metadata.name and key in (None, k) for m in machines]
        return sorted(found, key=lambda n: n.name)

    async def launch(
        self, request: AcquireRequest, have: Sequence[ProvidedNode]
    ) -> Launch[ProvidedNode]:
        """Create the key's nodes, as many as stock and injected grants allow. Node names
        are deterministic per key, so creating is idempotent and adopts: a retry finds the
        ones already made (409) and adds the rest."""
        pool = request.pool
        pool_name = pool.metadata.name
        error = self._take(pool_name, lambda i: i.errors) or self._drawn_error(pool)
        if error is not None:
            raise error
        grant = self._take(pool_name, lambda i: i.grants)
        if grant is None and request.count > 0 and self._draw(pool, "partial"):
            grant = self._fault_rng(pool).randrange(request.count)
        timeout = self._draw(pool, "timeout")
        allowed = await self._allowed(pool, request, grant)
        names = [_node_name(pool_name, request.key, i) for i in range(request.count)]
        if self._take(pool_name, lambda i: i.silent):
            machines = [_machine(pool, request, name) for name in names[:allowed]]
            silent = [ProvidedNode(m.name, m.provider_id, m.pool, m.key, m.owner, m.owner_uid)
                      for m in machines]
            self._silent[(pool_name, request.key)] = silent
            self._launched.add(request.key)
            return Launch(silent)
        placement = self._take(pool_name, lambda i: i.misplaced)
        try:
            results = await asyncio.gather(
                *(self._create_node(pool, request, name, placement)
                  for name in names[:allowed])
            )
        except ApiError as exc:
            raise TransientProviderError(
                f"pool {pool_name}: creating nodes failed: {exc}"
            ) from exc
        created = [node for node, _ in results]
        if any(fresh for _, fresh in results):
            self._launched.add(request.key)
        if timeout and allowed >= request.count:
            # The cloud did the work; its answer is lost on the way back.
            await asyncio.sleep(self._fault_seconds(pool))
            raise TransientProviderError(
                f"pool {pool_name}: the acquire call timed out (injected fault); its nodes "
                "may exist"
            )
        if allowed < request.count:
            return Launch(created, CapacityUnavailable(
                f"pool {pool_name} could only launch {allowed} of {request.count} node(s) in "
                f"{domain_key(request.domain) or 'any domain'}; the partial launch was "
                "rolled back",
                available=allowed,
            ))
        return Launch(created)

    async def delete(self, pool: CapacityPool, key: str, known: Sequence[ProvidedNode]) -> int:
        silent = {m.name for m in self._silent.pop((pool.metadata.name, key), [])}
        nodes = await self.find(pool, key)
        names = ({n.name for n in nodes} | {n.name for n in known}) - silent
        results = await asyncio.gather(*(self._delete_node(name) for name in sorted(names)))
        return sum(results) + len(silent)

    async def to_nodes(
        self, pool: CapacityPool, machines: Sequence[ProvidedNode], request: AcquireRequest | None
    ) -> Nodes:
        return list(machines)

    def guard(self, request: AcquireRequest) -> contextlib.AbstractAsyncContextManager[object]:
        """The domain's lock when its stock is limited (one per domain, not per request):
        counting the domain's nodes and creating ours is one step, and a shortfall's nodes
        are gone before anyone counts again."""
        if _reservation(request.pool) is not None:
            # A reservation is shared by every domain of the pool: one lock for the pool.
            return self._stock_locks[(request.pool.metadata.name, "reservation")]
        if self._stock_for(request.pool, request.domain) is None:
            return contextlib.nullcontext()
        return self._stock_locks[(request.pool.metadata.name, domain_key(request.domain))]

    async def _allowed(self, pool: CapacityPool, request: AcquireRequest, grant: int | None) -> int:
        """How many of the request's nodes may exist: stock and injected grants permitting."""
        stock = self._stock_for(pool, request.domain)
        allowed = request.count if grant is None else min(grant, request.count)
        held = _reservation(pool)
        if held is not None:
            # Only the reservation's free nodes, and only inside its window.
            _, size, start, end = held
            now = datetime.now(UTC)
            if (start is not None and now < start) or (end is not None and now >= end):
                return 0
            mine = len(await self.find(pool, request.key))
            allowed = min(allowed, size - (await self._pool_node_count(pool) - mine))
        if stock is None:
            return max(0, allowed)
        selector = f"{PROVIDER_LABEL}={self.name},{TAG_POOL}={pool.metadata.name}"
        listing = await self._kube.list(NODES, label_selector=selector)
        where = placed_in(pool.metadata.name, request)
        others = sum(
            1
            for n in listing.get("items") or []
            if all(n["metadata"].get("labels", {}).get(k) == v for k, v in where.items())
            and n["metadata"].get("labels", {}).get(TAG_KEY) != request.key
        )
        return max(0, min(allowed, stock - others))

    # ------------------------------------------------------------------ keep-alive

    async def start(self) -> None:
        """Adopt nodes left by an earlier process and start the heartbeat task."""
        listing = await self._kube.list(NODES, label_selector=f"{PROVIDER_LABEL}={self.name}")
        self._owned.update(n["metadata"]["name"] for n in listing.get("items") or [])
        if self._heartbeat_task is None and self.heartbeat_seconds > 0:
            self._heartbeat_task = asyncio.create_task(
                self._heartbeat_loop(), name="kind-heartbeat"
            )

    async def stop(self) -> None:
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _heartbeat_loop(self) -> None:
        ticks = 0
        with contextlib.suppress(ApiError):
            await self._kube.create(NAMESPACES, {"metadata": {"name": NODE_LEASE_NAMESPACE}})
        while True:
            # Node status every 4th tick, leases every tick: the cadence kwok and the kubelet
            # use (status updates are heavier and the node controller tolerates 40 s).
            await self._heartbeat(with_status=ticks % 4 == 0)
            ticks += 1
            await asyncio.sleep(self.heartbeat_seconds)

    async def _heartbeat(self, *, with_status: bool) -> None:
        now = _rfc3339_micro(self._now())
        for name in list(self._owned):
            try:
                await self._renew_lease(name, now)
                if with_status:
                    ready = _ready_condition(True, now, since=self._ready_since(name))
                    await self._kube.patch_status(NODES, name, {"conditions": [ready]})
            except ApiError as exc:
                if exc.not_found:
                    self._owned.discard(name)
                else:
                    log.warning("heartbeat of node %s failed: %s", name, exc)

    def _ready_since(self, node: str) -> str | None:
        """When the node became Ready, as first heartbeated by this process."""
        return self._since.setdefault(node, _rfc3339_micro(self._now()))

    async def _renew_lease(self, node: str, now: str) -> None:
        spec = {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now}
        try:
            await self._kube.merge_patch(
                LEASES, node, {"spec": spec}, namespace=NODE_LEASE_NAMESPACE
            )
        except ApiError as exc:
            if not exc.not_found:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": node, "namespace": NODE_LEASE_NAMESPACE},
                "spec": spec,
            }
            with contextlib.suppress(ApiError):
                await self._kube.create(LEASES, body, namespace=NODE_LEASE_NAMESPACE)

    # ------------------------------------------------------------------ internals

    def _record(self, op: str, request: AcquireRequest, outcome: str) -> None:
        self.calls.append(
            ProviderCall(
                op, request.pool.metadata.name, request.key, request.count,
                dict(request.domain), outcome,
            )
        )

    def _faults(self, pool: CapacityPool) -> Mapping[str, Any]:
        faults = pool.spec.parameters.get("faults")
        return faults if isinstance(faults, dict) else {}

    def _fault_rng(self, pool: CapacityPool) -> random.Random:
        name = pool.metadata.name
        rng = self._fault_rngs.get(name)
        if rng is None:
            seed = self._faults(pool).get("seed", 0)
            rng = self._fault_rngs[name] = random.Random(f"{name}/{seed}")
        return rng

    def _draw(self, pool: CapacityPool, kind: str) -> bool:
        """Whether the pool's ``parameters.faults`` injects ``kind`` into this call."""
        p = float(self._faults(pool).get(kind, 0) or 0)
        return p > 0 and self._fault_rng(pool).random() < p

    def _fault_seconds(self, pool: CapacityPool) -> float:
        return float(self._faults(pool).get("timeoutSeconds", 2.0))

    def _drawn_error(self, pool: CapacityPool) -> ProviderError | None:
        name = pool.metadata.name
        if self._draw(pool, "stockOut"):
            return CapacityUnavailable(
                f"pool {name}: no stock in the domain right now (injected fault)", available=0
            )
        if self._draw(pool, "quota"):
            return QuotaExceeded(f"pool {name}: account quota exceeded (injected fault)")
        if self._draw(pool, "throttle"):
            return TransientProviderError(
                f"pool {name}: request rate exceeded, throttled (injected fault)"
            )
        return None

    def _take(self, pool: str, queue: Callable[[_Injected], builtins.list[T]]) -> T | None:
        """The next injected value of ``queue`` for ``pool``, else for any pool."""
        for scope in (pool, "*"):
            values = queue(self._injected[scope])
            if values:
                return values.pop(0)
        return None

    def _stock_for(self, pool: CapacityPool, domain: Mapping[str, str]) -> int | None:
        name = pool.metadata.name
        override = self._stock.get((name, domain_key(domain)))
        if override is not None:
            return override
        params: Mapping[str, Any] = pool.spec.parameters
        for entry in params.get("stock") or []:
            if dict(entry.get("labels", {})) == dict(domain):
                return int(entry["nodes"])
        if "defaultStock" in params:
            return int(params["defaultStock"])
        return self.default_stock

    async def _delete_node(self, name: str) -> bool:
        self._owned.discard(name)
        self._since.pop(name, None)
        deleted = await self._kube.delete(NODES, name)
        crashpoints.reached("mid-release")
        with contextlib.suppress(ApiError):
            await self._kube.delete(LEASES, name, namespace=NODE_LEASE_NAMESPACE)
        return deleted

    async def _create_node(
        self, pool: CapacityPool, request: AcquireRequest, name: str,
        placement: Mapping[str, str] | None = None,
    ) -> tuple[ProvidedNode, bool]:
        """Create one node (or find it made by an earlier call); True when created now.
        ``placement``: where the cloud put it, when not where it was asked."""
        machine = _machine(pool, request, name)
        if placement is not None:
            machine = replace(machine, placement={**machine.placement, **placement})
        body = kubelet_node(machine, now=self._now(), provider=self.name)
        ready_delay = float(pool.spec.parameters.get("readyDelaySeconds", 0.0))
        if ready_delay:
            body["status"]["conditions"] = [_ready_condition(False, _rfc3339_micro(self._now()))]
            # Where kwok is the kubelet, its node-initialize stage waits this long before it
            # reports Ready (e2e/cluster.py adds the delay to kwok's stage).
            body["metadata"]["annotations"][BOOT_DELAY_ANNOTATION] = f"{ready_delay:g}s"
        fresh = True
        try:
            created = await self._kube.create(NODES, body)
        except ApiError as exc:
            if not exc.conflict:
                raise
            created, fresh = await self._kube.get(NODES, name), False
        self._owned.add(name)
        crashpoints.reached("mid-acquisition")
        await self._publish_devices(pool, created)
        if fresh and (not created.get("status", {}).get("allocatable") or ready_delay):
            # API servers that drop status on create (or a simulated boot) get it from the
            # "kubelet" afterwards, as a real node does.
            if ready_delay:
                _later(self._set_ready(name, body["status"], ready_delay))
            else:
                await self._kube.patch_status(NODES, name, body["status"])
        return _provided(created), fresh

    async def _publish_devices(self, pool: CapacityPool, node: Body) -> None:
        """The ResourceSlices a DRA driver on the node would publish (pool template), owned
        by the Node so they go away with it."""
        meta = node["metadata"]
        for body in render_resource_slices(pool, meta["name"]):
            if meta.get("uid"):
                body["metadata"]["ownerReferences"] = [
                    {"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta["uid"]}
                ]
            try:
                await self._kube.create(RESOURCE_SLICES, body)
            except ApiError as exc:
                if not exc.conflict:
                    raise

    async def _set_ready(self, name: str, status: Body, delay: float) -> None:
        await asyncio.sleep(delay)
        status = dict(status)
        status["conditions"] = [_ready_condition(True, _rfc3339_micro(self._now()))]
        with contextlib.suppress(ApiError):
            await self._kube.patch_status(NODES, name, status)


_background: set[asyncio.Task[None]] = set()


def _later(coro: Awaitable[None]) -> None:
    async def run() -> None:
        await coro

    task = asyncio.create_task(run())
    _background.add(task)
    task.add_done_callback(_background.discard)


def _node_name(pool: str, key: str, index: int) -> str:
    digest = hashlib.sha256(f"{pool}/{key}".encode()).hexdigest()[:10]
    return f"{pool[:40]}-{digest}-{index}"


@dataclass(frozen=True, slots=True)
class FakeMachine:
    """A machine of the fake cloud, as it boots: what the cloud gave it and its user data."""

    name: str
    provider_id: str
    pool: str
    key: str
    owner: str
    owner_uid: str
    placement: Mapping[str, str]
    """Where the cloud put it: the zone and topology labels the cloud-controller-manager
    reports for it."""
    capacity: Mapping[str, str]
    allocatable: Mapping[str, str]
    user_data: Mapping[str, Any]
    """``nodeLabels`` and ``registerWithTaints``, as kubelet flags in a real bootstrap."""


def user_data(pool: CapacityPool) -> dict[str, Any]:
    """The bootstrap the fake provider renders for a machine: the startup taint only (no
    label of Muster's: Muster writes those when it registers the node)."""
    return {"nodeLabels": {},
            "registerWithTaints": [{"key": UNREGISTERED_TAINT, "effect": "NoExecute"}]}


def placed_in(pool: str, request: AcquireRequest) -> dict[str, str]:
    """Where the fake cloud puts a request's machines: the requested domain, with a real
    value of its own for each placeholder the planner invented for a pool without declared
    domains (the cloud names a new placement group, not Muster)."""
    digest = hashlib.sha256(f"{pool}/{request.key}".encode()).hexdigest()[:10]
    return {k: (f"{pool[:40]}-{digest}" if placeholder(v) else v)
            for k, v in request.domain.items()}


def kubelet_node(machine: FakeMachine, *, now: datetime, provider: str = "kind") -> Body:
    """The Node a kubelet on ``machine`` registers (with the cloud-controller-manager's
    labels): only what the machine has."""
    labels = {
        **machine.user_data.get("nodeLabels", {}),
        **node_labels(machine.placement, hostname=machine.name),
        "type": "kwok",
        PROVIDER_LABEL: provider,
        TAG_POOL: machine.pool,
        TAG_KEY: machine.key,
    }
    if machine.owner_uid:
        labels[TAG_OWNER_UID] = machine.owner_uid
    stamp = _rfc3339_micro(now)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": machine.name,
            "labels": labels,
            "annotations": {
                TAG_OWNER: machine.owner,
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": {
            "providerID": machine.provider_id,
            "taints": [dict(t) for t in machine.user_data.get("registerWithTaints", [])],
        },
        "status": {
            "capacity": dict(machine.capacity),
            "allocatable": dict(machine.allocatable),
            "conditions": [_ready_condition(True, stamp)],
            "addresses": [{"type": "Hostname", "address": machine.name}],
            "nodeInfo": {
                "kubeletVersion": "fake",
                "architecture": labels[ARCH],
                "operatingSystem": labels[OS],
            },
            "phase": "Running",
        },
    }


def _machine(pool: CapacityPool, request: AcquireRequest, name: str) -> FakeMachine:
    """The machine the fake cloud launches as ``name`` for ``request``."""
    tpl = pool.spec.node_template
    index = name.rsplit("-", 1)[-1]
    allocatable = dict(tpl.allocatable)
    allocatable.setdefault("pods", "110")
    capacity = dict(tpl.capacity or allocatable)
    capacity.setdefault("pods", allocatable["pods"])
    return FakeMachine(
        name=name,
        provider_id=f"kind://{pool.metadata.name}/{request.key}/{index}",
        pool=pool.metadata.name,
        key=request.key,
        owner=request.owner,
        owner_uid=request.owner_uid,
        placement={**cloud_facts(pool.spec.parameters), **placed_in(pool.metadata.name, request)},
        capacity=capacity,
        allocatable=allocatable,
        user_data=user_data(pool),
    )


def _ready_condition(ready: bool, now: str, *, since: str | None = None) -> Body:
    """The kubelet's Ready condition; ``since`` keeps lastTransitionTime on heartbeats."""
    return {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "KubeletReady" if ready else "KubeletNotReady",
        "message": "fake node kept alive by Muster's fake provider",
        "lastHeartbeatTime": now[:19] + "Z",
        "lastTransitionTime": (since or now)[:19] + "Z",
    }


def _rfc3339_micro(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _provided(node: Body) -> ProvidedNode:
    meta = node.get("metadata", {})
    labels: dict[str, str] = meta.get("labels") or {}
    return ProvidedNode(
        name=meta.get("name", ""),
        provider_id=node.get("spec", {}).get("providerID", ""),
        pool=labels.get(TAG_POOL, ""),
        key=labels.get(TAG_KEY, ""),
        owner=(meta.get("annotations") or {}).get(TAG_OWNER, ""),
        owner_uid=labels.get(TAG_OWNER_UID, ""),
        labels=labels,
    )


def _reservation(
    pool: CapacityPool,
) -> tuple[str, int, datetime | None, datetime | None] | None:
    """``parameters.reservation`` read: (id, nodes, start, end); ValueError/TypeError/KeyError
    when malformed."""
    value = pool.spec.parameters.get("reservation")
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"id", "nodes", "start", "end"}:
        raise ValueError("unknown or missing fields")
    rid, size = value["id"], value["nodes"]
    if not isinstance(rid, str) or not rid or not isinstance(size, int) or size < 0:
        raise ValueError("id must be a name, nodes an integer >= 0")

    def when(text: Any) -> datetime | None:
        if text is None:
            return None
        parsed = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            raise ValueError(f"{text!r} has no time zone")
        return parsed

    return rid, size, when(value.get("start")), when(value.get("end"))


def _validate_faults(pool: str, faults: Any) -> None:
    if faults is None:
        return
    if not isinstance(faults, dict):
        raise ProviderConfigError(
            f"pool {pool}: parameters.faults must be a mapping of "
            f"{', '.join(FAULT_KINDS)}, seed, timeoutSeconds"
        )
    unknown_faults = set(faults) - {*FAULT_KINDS, "seed", "timeoutSeconds"}
    if unknown_faults:
        raise ProviderConfigError(
            f"pool {pool}: unknown parameters.faults key(s) "
            f"{sorted(unknown_faults)}; known: "
            f"{sorted({*FAULT_KINDS, 'seed', 'timeoutSeconds'})}"
        )
    for name in FAULT_KINDS:
        value = faults.get(name, 0)
        if not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ProviderConfigError(
                f"pool {pool}: parameters.faults.{name} must be a "
                f"probability between 0 and 1, got {value!r}"
            )
    for name in ("seed", "timeoutSeconds"):
        value = faults.get(name, 0)
        if not isinstance(value, int | float) or value < 0:
            raise ProviderConfigError(
                f"pool {pool}: parameters.faults.{name} must be a "
                f"number >= 0, got {value!r}"
            )
