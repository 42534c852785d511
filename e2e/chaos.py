"""The crash harness: ``muster run`` killed and restarted against the real control plane,
then the promises checked against the API.

``python3 -m e2e.chaos --seed 1 --crashes 1000`` starts the local control plane
(:mod:`e2e.cluster`; reused when up), a CapacityPool of the fake provider in its own
namespace and labels, and Muster as its own process under its ServiceAccount (as
:class:`e2e.real.MusterProcess` runs it). Requests arrive and are deleted all the time while
Muster is killed with SIGKILL, round after round:

* at a random moment (0-3 s after it became ready), or
* at a named step of the acquisition path (``MUSTER_CRASH_AT``,
  :mod:`controller.common.crashpoints`:
  plan persisted, mid-acquisition, acquired, before the status write, outcome written,
  mid-release), the process killing itself there;
* every ``--failover-every`` rounds: two replicas with leader election, the leader killed
  while an acquisition is in flight (the pool slowed down for it), the standby taking over;
* every ``--apiserver-every`` rounds: kube-apiserver restarted (etcd keeps the data) while
  Muster runs.

``--faults`` adds the fake provider's injected faults (stock-outs, quota, throttling,
timeouts that create nodes and lose the answer, k-of-n grants, failing releases) on the
pool for the whole run. At the end Muster runs undisturbed (faults off) for
``--settle`` seconds and the invariants are checked against what the API server said,
recorded from watches all along (resourceVersions order the events of nodes and requests):

1. every request is Provisioned (booked, or its booking ended), Failed with a reason, or
   still retrying within ``retry.max_attempts``; none without a condition;
2. no node of the pool without a live booking or an acquisition in flight after the
   collector's grace;
3. no node deleted while a live booking counted on it (its key in the booking's groups, or
   named by one of the plan's assignments);
4. no acquisition key with more nodes than its group planned, no request holding more nodes
   than its plan at the end;
5. no partial gang: when a request became Provisioned=True every group had all its nodes;
6. no device booked twice: at every change of the live bookings, no node's GPUs are booked
   beyond its allocatable.

The last line printed is ``chaos crashes=N requests=M violations=V``; exit 0 when V is 0.
Bounded: ``--crashes`` and ``--max-minutes`` (whichever comes first); SIGINT or SIGTERM
ends the crashing early, and the checks and the clean-up still run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.commands import objects
from controller.common import crashpoints
from controller.common.topology_defaults import KEY_LABEL, OWNER_UID_LABEL
from controller.kube import ApiError, Body, KubeClient, WatchEvent, whole_listing
from controller.kube.resources import (
    CAPACITY_POOLS,
    NAMESPACES,
    NODES,
    POD_TEMPLATES,
    PROVISIONING_REQUESTS,
)
from e2e import cluster as cp
from e2e.real import MusterProcess
from providers import fake

ROOT = Path(__file__).resolve().parents[1]
CHAOS_CONFIG = ROOT / "e2e" / "muster-chaos.yaml"
RUN_LABEL = "chaos.muster.dev/run"
POOL_LABEL = "muster.dev/pool"
PLAN = "muster.dev/plan"
PHASE = "muster.dev/phase"
ATTEMPT = "muster.dev/attempt"
ATOMIC = "atomic-provisioning.muster.dev"
CHECK = "check-capacity.muster.dev"
ENDINGS = ("BookingExpired", "CapacityRevoked", "Failed")
MAX_ATTEMPTS = 4  # e2e/muster-chaos.yaml
ORPHAN_GRACE = 15.0  # e2e/muster-chaos.yaml, acquisition.orphan_grace_seconds
FAULTS = {"seed": 0, "stockOut": 0.1, "quota": 0.02, "throttle": 0.1, "timeout": 0.05,
          "partial": 0.1, "releaseError": 0.3, "timeoutSeconds": 1}


FAULT_PHRASES = {
    "stockOut": "no stock in the domain", "quota": "quota exceeded", "throttle": "throttled",
    "timeout": "timed out", "partial": "could only launch",
}
"""How each of the fake provider's injected faults reads in a request's condition."""


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- what was seen


@dataclass
class NodeSeen:
    key: str
    owner_uid: str
    gpus: int
    added_rv: int | None
    """The ADDED event's resourceVersion; None when first seen in a (re-)list."""
    deleted_rv: tuple[int, int] | None = None
    """(last rv seen alive, deletion rv); equal ends for a DELETED event, a range when a
    re-list found it gone."""


@dataclass
class Live:
    """A request's booking as one version of it shows it (None fields: not live)."""

    rv: int
    live: bool
    keys: frozenset[str] = frozenset()
    existing: frozenset[str] = frozenset()
    groups: tuple[tuple[str, int, str, tuple[tuple[str, str], ...]], ...] = ()
    """(key, count, pool, domain) per group."""
    assignments: tuple[tuple[str | None, tuple[Any, ...] | None, int, int], ...] = ()
    """(node, slot (pool, domain, index), pods, gpus per pod)"""


def conditions(body: Body) -> dict[str, Body]:
    return {c.get("type", ""): c for c in (body.get("status") or {}).get("conditions") or []}


def booking_of(body: Body) -> dict[str, Any] | None:
    text = ((body.get("metadata") or {}).get("annotations") or {}).get(PLAN)
    if not text:
        return None
    try:
        data: dict[str, Any] = json.loads(text)
    except ValueError:
        return None
    return data


def live_of(body: Body, rv: int, *, deleted: bool = False) -> Live:
    conds = conditions(body)
    booking = booking_of(body)
    live = (not deleted and booking is not None
            and not body["metadata"].get("deletionTimestamp")
            and conds.get("Provisioned", {}).get("status") == "True"
            and not any(conds.get(t, {}).get("status") == "True" for t in ENDINGS))
    if not live or booking is None:
        return Live(rv, False)
    groups = tuple(
        (g["key"], int(g["count"]), g["pool"], tuple(sorted((g.get("domain") or {}).items())))
        for g in booking.get("groups") or [])
    assignments = []
    for a in booking["plan"]["assignments"]:
        slot = a.get("slot")
        gpus = int(str((a.get("requests") or {}).get(objects.GPU, "0")) or 0)
        assignments.append((a.get("node"), (slot[0], tuple(sorted(slot[1].items())), slot[2])
                            if slot else None, int(a["pods"]), gpus))
    return Live(rv, True, frozenset(g[0] for g in groups),
                frozenset(a[0] for a in assignments if a[0]), groups, tuple(assignments))


@dataclass
class Recorder:
    """Nodes and requests of the run as watches reported them, ordered by resourceVersion."""

    nodes: dict[str, NodeSeen] = field(default_factory=dict)
    requests: dict[str, list[Live]] = field(default_factory=lambda: defaultdict(list))
    current: dict[str, Body] = field(default_factory=dict)
    keys_count: dict[str, int] = field(default_factory=dict)
    """Acquisition key -> planned count (from every plan seen)."""
    node_names_by_key: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    node_rv: dict[str, int] = field(default_factory=dict)
    faults: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Injected provider fault kind -> requests whose conditions reported it."""

    # nodes
    def node_sync(self, items: list[Body], list_rv: int) -> None:
        names = set()
        for body in items:
            names.add(body["metadata"]["name"])
            self._node_seen(body, added_rv=None)
        for name, seen in self.nodes.items():
            if seen.deleted_rv is None and name not in names:
                seen.deleted_rv = (self.node_rv.get(name, 0), list_rv)

    def node_event(self, ev: WatchEvent) -> None:
        body = ev.object
        rv = int(body["metadata"]["resourceVersion"])
        if ev.type == "DELETED":
            name = body["metadata"]["name"]
            self._node_seen(body, added_rv=None)
            if self.nodes[name].deleted_rv is None:
                self.nodes[name].deleted_rv = (rv, rv)
            return
        self._node_seen(body, added_rv=rv if ev.type == "ADDED" else None)

    def _node_seen(self, body: Body, *, added_rv: int | None) -> None:
        meta = body["metadata"]
        name = meta["name"]
        labels = meta.get("labels") or {}
        self.node_rv[name] = int(meta["resourceVersion"])
        seen = self.nodes.get(name)
        if seen is None or (seen.deleted_rv is not None and added_rv is not None):
            alloc = (body.get("status") or {}).get("allocatable") or {}
            # A node registers with the fake cloud's tags only; Muster's labels come when it
            # registers the node (a rolled-back one may never get them).
            key = labels.get(KEY_LABEL) or labels.get(fake.TAG_KEY, "")
            self.nodes[name] = NodeSeen(
                key=key,
                owner_uid=labels.get(OWNER_UID_LABEL) or labels.get(fake.TAG_OWNER_UID, ""),
                gpus=int(alloc.get(objects.GPU, "0")), added_rv=added_rv)
            self.node_names_by_key[key].add(name)

    # requests
    def request_sync(self, items: list[Body], list_rv: int) -> None:
        """A (re-)list shows each request's latest version only: the versions in between,
        missed while the watch was down (an API server restart), are unknown. A booking that
        was live and is no longer (ended, deleted, gone) may have stopped being live at any
        of them, so it counts as not live from just after the last version seen: a node
        released after an unseen ending is no violation (the CI subset's r15: BookingExpired
        written, then its nodes deleted, then the annotation; the re-list saw only the last)."""
        keys = set()
        for body in items:
            keys.add(self._key(body))
            self._request_seen(body, int(body["metadata"]["resourceVersion"]), gap=True)
        for key in list(self.current):
            if key not in keys:
                self._not_live_after_gap(key, list_rv)
                del self.current[key]

    def _not_live_after_gap(self, key: str, rv: int) -> None:
        history = self.requests[key]
        if history and history[-1].live:
            rv = min(rv, history[-1].rv + 1)
        if not history or history[-1].rv < rv:
            history.append(Live(rv, False))

    def request_event(self, ev: WatchEvent) -> None:
        body = ev.object
        rv = int(body["metadata"]["resourceVersion"])
        if ev.type == "DELETED":
            self.requests[self._key(body)].append(Live(rv, False))
            self.current.pop(self._key(body), None)
            return
        self._request_seen(body, rv)

    @staticmethod
    def _key(body: Body) -> str:
        return f"{body['metadata']['namespace']}/{body['metadata']['name']}"

    def _request_seen(self, body: Body, rv: int, *, gap: bool = False) -> None:
        """``gap``: from a list, so versions between the last one seen and this may be
        missing."""
        key = self._key(body)
        self.current[key] = body
        for cond in conditions(body).values():
            text = str(cond.get("message") or "")
            for kind, phrase in FAULT_PHRASES.items():
                if phrase in text:
                    self.faults[kind].add(key)
        booking = booking_of(body)
        for g in (booking or {}).get("groups") or []:
            self.keys_count[g["key"]] = int(g["count"])
        history = self.requests[key]
        if history and history[-1].rv >= rv:
            return
        now = live_of(body, rv)
        if gap and not now.live:
            self._not_live_after_gap(key, rv)
            return
        history.append(now)

    # queries
    def live_at(self, key: str, rv: int) -> Live | None:
        """The request's state as of just before ``rv``."""
        found = None
        for entry in self.requests.get(key, []):
            if entry.rv < rv:
                found = entry
            else:
                break
        return found

    def live_through(self, key: str, lo: int, hi: int) -> Live | None:
        """A live state the request was in all the way from ``lo`` to ``hi``."""
        entry = self.live_at(key, lo + 1)
        if entry is None or not entry.live:
            return None
        for later in self.requests.get(key, []):
            if lo < later.rv < hi and not later.live:
                return None
        return entry


def check_deletions(rec: Recorder) -> list[str]:
    """Invariant 3: no node deleted under a live booking."""
    out = []
    for name, seen in rec.nodes.items():
        if seen.deleted_rv is None:
            continue
        lo, hi = seen.deleted_rv
        for key in rec.requests:
            live = rec.live_through(key, min(lo, hi - 1), hi)
            if live is None:
                continue
            if seen.key in live.keys or name in live.existing:
                history = ", ".join(f"{e.rv}:{'live' if e.live else '-'}"
                                    for e in rec.requests[key])
                out.append(f"node {name} (key {seen.key}) deleted (rv {lo}..{hi}) under the "
                           f"live booking of {key} (its history {history})")
    return out


def _nodes_at(rec: Recorder, key: str, rv: int) -> list[str]:
    out = []
    for name in sorted(rec.node_names_by_key.get(key, ())):
        seen = rec.nodes[name]
        if seen.added_rv is not None and seen.added_rv > rv:
            continue
        if seen.deleted_rv is not None and seen.deleted_rv[1] <= rv:
            continue
        out.append(name)
    return out


def check_gangs_and_devices(rec: Recorder) -> list[str]:
    """Invariants 4-6 over the recorded histories."""
    out = []
    for key, names in rec.node_names_by_key.items():
        if key and key in rec.keys_count and len(names) > rec.keys_count[key]:
            out.append(f"acquisition key {key}: {len(names)} nodes, planned "
                       f"{rec.keys_count[key]}")
    became: list[tuple[int, str, Live]] = []
    for key, history in rec.requests.items():
        before = False
        for entry in history:
            if entry.live and not before:
                became.append((entry.rv, key, entry))
            before = entry.live
    for rv, key, entry in became:
        for name in sorted(entry.existing):
            seen = rec.nodes.get(name)
            if seen is not None and seen.deleted_rv is not None and seen.deleted_rv[1] <= rv:
                out.append(f"{key}: Provisioned=True (rv {rv}) on node {name}, deleted at rv "
                           f"{seen.deleted_rv[1]}")
        for gkey, count, _, _ in entry.groups:
            have = _nodes_at(rec, gkey, rv)
            if len(have) < count:
                out.append(f"{key}: Provisioned=True (rv {rv}) with {len(have)} of {count} "
                           f"node(s) of group {gkey}")
    # Devices: at each rv where some request became live, the live bookings' GPUs per node.
    for rv, _, _ in became:
        per_node: dict[str, int] = defaultdict(int)
        holders: dict[str, list[str]] = defaultdict(list)
        for key in rec.requests:
            live = rec.live_at(key, rv + 1)
            if live is None or not live.live:
                continue
            slots: dict[tuple[str, tuple[tuple[str, str], ...]], list[str]] = {}
            for gkey, _, pool, domain in live.groups:
                slots[(pool, domain)] = _nodes_at(rec, gkey, rv)
            for node, slot, pods, gpus in live.assignments:
                if node is None and slot is not None:
                    slot_nodes = slots.get((slot[0], slot[1]), [])
                    node = slot_nodes[slot[2]] if slot[2] < len(slot_nodes) else None
                if node is None:
                    continue
                per_node[node] += pods * gpus
                holders[node].append(key)
        for node, used in per_node.items():
            seen = rec.nodes.get(node)
            if seen is not None and seen.gpus and used > seen.gpus:
                out.append(f"node {node}: {used} GPUs booked of {seen.gpus} at rv {rv} by "
                           f"{sorted(set(holders[node]))}")
    return out


def check_outcomes(rec: Recorder, max_attempts: int) -> list[str]:
    """Invariant 1, on the requests that still exist."""
    out = []
    for key, body in rec.current.items():
        if body["metadata"].get("deletionTimestamp"):
            continue
        conds = conditions(body)
        failed = conds.get("Failed", {})
        provisioned = conds.get("Provisioned", {})
        attempt = int(((body["metadata"].get("annotations") or {}).get(ATTEMPT)) or 0)
        if failed.get("status") == "True":
            if not failed.get("reason"):
                out.append(f"{key}: Failed without a reason")
        elif provisioned.get("status") == "True":
            pass
        elif provisioned.get("status") == "False" and attempt <= max_attempts:
            pass  # retrying within its bounds
        else:
            out.append(f"{key}: no outcome (conditions {sorted(conds)}, attempt {attempt})")
    return out


def unbooked_nodes(rec: Recorder) -> list[str]:
    """Invariant 2: nodes that exist with neither a live booking nor an acquisition in
    flight holding their key."""
    held: set[str] = set()
    existing: set[str] = set()
    for body in rec.current.values():
        phase = ((body["metadata"].get("annotations") or {}).get(PHASE)) or ""
        booking = booking_of(body) or {}
        live = live_of(body, 0)
        if live.live or phase == "Acquiring":
            held |= {g["key"] for g in booking.get("groups") or []}
            existing |= live.existing
    return sorted(name for name, seen in rec.nodes.items()
                  if seen.deleted_rv is None and seen.key not in held and name not in existing)


# --------------------------------------------------------------------------- the run


async def remove_run(kube: KubeClient, namespace: str, pool: str, requests: list[str], *,
                     release_within: float = 60) -> None:
    """A run's requests first (Muster releases their nodes: waited for up to
    ``release_within`` seconds), then its pool (once gone) and its namespace. What fails
    to go is left for the caller's own checks, not raised."""
    for name in requests:
        with contextlib.suppress(ApiError):
            await kube.delete(PROVISIONING_REQUESTS, name, namespace=namespace)
    deadline = time.monotonic() + release_within
    while time.monotonic() < deadline:
        listing = await kube.list(NODES, label_selector=f"{fake.TAG_POOL}={pool}")
        if not listing.get("items"):
            break
        await asyncio.sleep(1)
    with contextlib.suppress(ApiError):
        await kube.delete(CAPACITY_POOLS, pool)
    for _ in range(30):
        if await kube.get_or_none(CAPACITY_POOLS, pool) is None:
            break
        await asyncio.sleep(1)
    with contextlib.suppress(ApiError):
        await kube.delete(NAMESPACES, namespace)


@dataclass
class Options:
    seed: int = 1
    crashes: int = 20
    max_minutes: float = 10.0
    failover_every: int = 0
    apiserver_every: int = 0
    faults: bool = False
    settle: float = 45.0
    """Longer than the controller's longest error backoff (30 s): a request whose
    reconciles failed many times in a row is retried within it."""
    arrivals: int = 3
    """Requests created per round."""
    keep: bool = False
    """Leave the run's objects (and Muster stopped) when a violation was found: to look."""
    cycle_steps: bool = False
    """Crash at each named step in turn (first passage), not at random ones: a short run
    covers every step."""


@dataclass
class Result:
    crashes: int = 0
    planned: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    requests: int = 0
    violations: list[str] = field(default_factory=list)
    failovers: int = 0
    apiserver_restarts: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Final state of the requests left at the end, and of those deleted on the way."""
    nodes_created: int = 0
    revoked: list[str] = field(default_factory=list)
    """Requests whose booking Muster revoked, with its message (nodes vanished: who?)."""

    def line(self) -> str:
        return (f"chaos crashes={self.crashes} requests={self.requests} "
                f"violations={len(self.violations)}")


class Chaos:
    def __init__(self, cluster: cp.Cluster, opts: Options) -> None:
        self.cluster = cluster
        self.opts = opts
        self.rng = random.Random(opts.seed)
        self.run = f"{opts.seed}-{uuid.uuid4().hex[:5]}"
        self.ns = f"chaos-{self.run}"
        self.pool = f"chaos-{self.run}"
        self.rec = Recorder()
        self.result = Result()
        self.kube: KubeClient | None = None
        self.seq = 0
        self.alive: list[str] = []
        self._cycled = 0
        self.muster = self._process(0)
        self.standby = self._process(1)

    def _process(self, replica: int) -> MusterProcess:
        env = {
            "MUSTER_LEADER_ELECTION__ENABLED": "false",
            "MUSTER_KUEUE__ENABLED": "false",
        }
        proc = MusterProcess(self.cluster, config=CHAOS_CONFIG, extra_env=env, replica=replica)
        # Its own log: the test tier reads muster.log for the session's Muster.
        proc.log = self.cluster.logs / f"chaos-muster-{replica}.log"
        return proc

    # ---------------------------------------------------------------- setup

    async def setup(self) -> None:
        assert self.kube is not None
        await self.kube.create(NAMESPACES, {"metadata": {"name": self.ns,
                                                         "labels": {RUN_LABEL: self.run}}})
        params: dict[str, Any] = {}
        if self.opts.faults:
            params["faults"] = {**FAULTS, "seed": self.opts.seed}
        pool = objects.gpu_pool(self.pool, blocks=2, racks_per_block=2, nodes_per_rack=4,
                                max_nodes=16, parameters=params)
        pool["spec"]["nodeTemplate"]["labels"][RUN_LABEL] = self.run
        await self.kube.create(CAPACITY_POOLS, pool)
        for name, gpus in (("w8", "8"), ("w4", "4")):
            body = objects.pod_template(
                name, namespace=self.ns, requests={"cpu": "1", "memory": "1Gi", objects.GPU: gpus},
                required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
                node_selector={RUN_LABEL: self.run})
            await self.kube.create(POD_TEMPLATES, body, namespace=self.ns)

    async def watch(self) -> None:
        assert self.kube is not None
        kube = self.kube

        async def node_sync(items: list[Body]) -> None:
            listing = await kube.list(NODES, label_selector=f"{fake.TAG_POOL}={self.pool}")
            self.rec.node_sync(items, int(listing["metadata"]["resourceVersion"]))

        async def request_sync(items: list[Body]) -> None:
            listing = await kube.list(PROVISIONING_REQUESTS, namespace=self.ns)
            self.rec.request_sync(items, int(listing["metadata"]["resourceVersion"]))

        await asyncio.gather(
            kube.watch(NODES, whole_listing(node_sync), self.rec.node_event,
                       label_selector=f"{fake.TAG_POOL}={self.pool}"),
            kube.watch(PROVISIONING_REQUESTS, whole_listing(request_sync), self.rec.request_event,
                       namespace=self.ns),
        )

    # ---------------------------------------------------------------- workload

    async def arrive(self, count: int, *, atomic: bool = False) -> None:
        """``count`` new requests; ``atomic``: each needs new nodes (no check-capacity)."""
        assert self.kube is not None
        for _ in range(count):
            self.seq += 1
            name = f"r{self.seq}"
            roll = self.rng.uniform(0.25, 1.0) if atomic else self.rng.random()
            if roll < 0.25:
                # Books existing nodes only, often ones another request acquired.
                pod_sets, cls = [("w4", self.rng.randint(1, 3))], CHECK
            elif roll < 0.6:
                pod_sets, cls = [("w4", self.rng.randint(1, 5))], ATOMIC
            else:
                pod_sets, cls = [("w8", self.rng.randint(1, 4))], ATOMIC
            body = objects.provisioning_request(name, pod_sets=pod_sets, namespace=self.ns,
                                                class_name=cls)
            with contextlib.suppress(ApiError):
                await self.kube.create(PROVISIONING_REQUESTS, body, namespace=self.ns)
                self.alive.append(name)
                self.result.requests += 1

    async def depart(self) -> None:
        """Delete some of the oldest requests (users giving up or done)."""
        assert self.kube is not None
        while len(self.alive) > 12 or (self.alive and self.rng.random() < 0.3):
            name = self.alive.pop(self.rng.randrange(min(4, len(self.alive))))
            with contextlib.suppress(ApiError):
                await self.kube.delete(PROVISIONING_REQUESTS, name, namespace=self.ns)

    # ---------------------------------------------------------------- crashes

    async def _start(self, proc: MusterProcess, *, crash_at: str | None = None,
                     wait: bool = True) -> None:
        if crash_at:
            proc.extra_env[crashpoints.ENV] = crash_at
        else:
            proc.extra_env.pop(crashpoints.ENV, None)
        proc.start(wait=False)
        if wait:
            await asyncio.to_thread(proc.wait_ready, 90.0)

    async def _died(self, proc: MusterProcess, within: float) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if proc.proc is not None and proc.proc.poll() is not None:
                return True
            await asyncio.sleep(0.05)
        return False

    def _reap(self, proc: MusterProcess, *, planned: bool) -> None:
        """After a kill: an exit other than SIGKILL is Muster exiting on its own."""
        code = proc.stop(signal.SIGKILL)
        if code is not None and code != -signal.SIGKILL and not (planned and code == 0):
            self.result.violations.append(f"muster run exited {code} on its own:\n"
                                          f"{proc.tail(15)}")

    async def crash_round(self) -> None:
        """One crash: at a named step (the process kills itself there) or at random."""
        step = None
        if self.opts.cycle_steps:
            step = crashpoints.STEPS[self._cycled % len(crashpoints.STEPS)]
            self._cycled += 1
            await self._start(self.muster, crash_at=f"{step}:1", wait=False)
        elif self.rng.random() < 0.6:
            step = self.rng.choice(crashpoints.STEPS)
            nth = self.rng.randint(1, 3)
            await self._start(self.muster, crash_at=f"{step}:{nth}", wait=False)
        else:
            await self._start(self.muster, wait=False)
        await self.arrive(self.opts.arrivals)
        await self.depart()
        if step is not None:
            if await self._died(self.muster, 20.0):
                how = f"at {step}"
            else:
                how = f"at {step} not reached in 20 s: killed"
        else:
            with contextlib.suppress(AssertionError):
                await asyncio.to_thread(self.muster.wait_ready, 60.0)
            await asyncio.sleep(self.rng.uniform(0.0, 3.0))
            how = "at random"
        self._reap(self.muster, planned=True)
        self.result.crashes += 1
        self.result.planned[how if step is None or how.endswith("killed")
                            else f"at {step}"] += 1

    async def failover_round(self) -> None:
        """Two replicas with leader election; SIGKILL the leader while an acquisition is in
        flight (the pool's acquisitions slowed to 2 s meanwhile)."""
        assert self.kube is not None
        await self._set_pool_parameter("latencySeconds", 2)
        a, b = self.muster, self.standby
        for p in (a, b):
            p.extra_env.pop("MUSTER_LEADER_ELECTION__ENABLED", None)
            p.extra_env.pop(crashpoints.ENV, None)
            p.start(wait=False)
        try:
            leader = await self._leader((a, b), within=60)
            await self.arrive(self.opts.arrivals)
            await self._until_acquiring(within=20)
            self._reap(leader, planned=True)
            self.result.crashes += 1
            self.result.failovers += 1
            self.result.planned["leader failover"] += 1
            other = b if leader is a else a
            t0 = time.monotonic()
            try:
                await asyncio.to_thread(other.wait_ready, 60.0, roles=("leader",))
                log(f"failover: standby led after {time.monotonic() - t0:.1f} s")
            except AssertionError as exc:
                self._exited(other, str(exc))
        finally:
            await self._set_pool_parameter("latencySeconds", None)
            for p in (a, b):
                self._reap(p, planned=True)
                p.extra_env["MUSTER_LEADER_ELECTION__ENABLED"] = "false"

    def _exited(self, proc: MusterProcess, why: str) -> None:
        """A replica exited while the harness waited for it. A leader that could not renew
        its Lease in time exits by design (the kubelet restarts it; on a loaded machine the
        harness's 3 s renew deadline is sometimes missed): counted, not a violation.
        Any other exit is one."""
        proc.stop(signal.SIGKILL)
        if "lost the lease" in why:
            self.result.planned["leader exited: lease lost under load"] += 1
        else:
            self.result.violations.append(f"muster run exited on its own: {why}")

    async def _leader(self, procs: tuple[MusterProcess, ...], within: float) -> MusterProcess:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for p in procs:
                if await asyncio.to_thread(p.role, ready=True) == "leader":
                    return p
            await asyncio.sleep(0.2)
        raise RuntimeError("no replica became the leader:\n" + procs[0].tail(20))

    async def _until_acquiring(self, within: float) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for body in self.rec.current.values():
                ann = body["metadata"].get("annotations") or {}
                if ann.get(PHASE) == "Acquiring" and "Provisioned" not in {
                        k for k, v in conditions(body).items() if v.get("status") == "True"}:
                    return
            await asyncio.sleep(0.05)

    async def apiserver_round(self) -> None:
        """kube-apiserver stopped and started again (etcd keeps every object) while Muster
        runs with acquisitions going on; Muster must ride it out."""
        await self._start(self.muster)
        await self.arrive(self.opts.arrivals)
        await asyncio.sleep(self.rng.uniform(0.0, 1.5))
        t0 = time.monotonic()
        await asyncio.to_thread(cp.restart_apiserver, self.cluster)
        self.result.apiserver_restarts += 1
        log(f"kube-apiserver restarted in {time.monotonic() - t0:.1f} s")
        if not self.muster.running:
            self.result.violations.append("muster run exited during an API server restart:\n"
                                          + self.muster.tail(15))
        try:
            await asyncio.to_thread(self.muster.wait_ready, 90.0)
        except AssertionError as exc:
            self._exited(self.muster, str(exc))
        await asyncio.sleep(2.0)
        self._reap(self.muster, planned=True)
        self.result.crashes += 1
        self.result.planned["after apiserver restart"] += 1

    async def _set_pool_parameter(self, name: str, value: Any) -> None:
        assert self.kube is not None
        for _ in range(5):
            with contextlib.suppress(ApiError):
                await self.kube.merge_patch(CAPACITY_POOLS, self.pool,
                                            {"spec": {"parameters": {name: value}}})
                return
            await asyncio.sleep(1)

    # ---------------------------------------------------------------- the end

    async def settle_and_check(self) -> None:
        """Faults off, Muster undisturbed, then every invariant."""
        if self.opts.faults:
            await self._set_pool_parameter("faults", None)
        await self._start(self.muster)
        log(f"settling for {self.opts.settle:.0f} s")
        await asyncio.sleep(self.opts.settle)
        v = self.result.violations
        v += check_outcomes(self.rec, MAX_ATTEMPTS)
        # The collector's grace (nodes of a deleted request wait out the orphan grace once
        # no booking uses them) + its interval, and a stream's worth of lag.
        leftover = unbooked_nodes(self.rec)
        deadline = time.monotonic() + ORPHAN_GRACE + 20
        while leftover and time.monotonic() < deadline:
            await asyncio.sleep(1)
            leftover = unbooked_nodes(self.rec)
        v += [f"node {n} exists without a booking after the collector's grace"
              for n in leftover]
        v += check_deletions(self.rec)
        v += check_gangs_and_devices(self.rec)
        v += self._over_plan()
        self._tally()
        if not self.muster.running:
            v.append("muster run was not running at the end:\n" + self.muster.tail(15))

    def _tally(self) -> None:
        for body in self.rec.current.values():
            conds = conditions(body)
            for t in ("Failed", *ENDINGS, "Provisioned"):
                c = conds.get(t)
                if c and c.get("status") == "True":
                    self.result.outcomes[f"{t}/{c.get('reason')}"] += 1
                    if t == "CapacityRevoked":
                        self.result.revoked.append(f"{body['metadata']['name']}: "
                                                   f"{c.get('message')}")
                    break
            else:
                c = conds.get("Provisioned") or {}
                self.result.outcomes[f"retrying/{c.get('reason')}"] += 1
        self.result.outcomes["deleted on the way"] = self.result.requests - len(self.rec.current)
        self.result.nodes_created = len(self.rec.nodes)

    def _over_plan(self) -> list[str]:
        """Invariant 4 at rest: no request holds more nodes than its plan."""
        out = []
        by_uid: dict[str, int] = defaultdict(int)
        for seen in self.rec.nodes.values():
            if seen.deleted_rv is None and seen.owner_uid:
                by_uid[seen.owner_uid] += 1
        for key, body in self.rec.current.items():
            planned = sum(int(g["count"]) for g in (booking_of(body) or {}).get("groups") or [])
            have = by_uid.get(body["metadata"]["uid"], 0)
            if have > planned:
                out.append(f"{key}: holds {have} node(s), its plan {planned}")
        return out

    async def cleanup(self) -> None:
        """Requests first (Muster releases their nodes), then the pool and namespace."""
        assert self.kube is not None
        kube = self.kube
        with contextlib.suppress(Exception):
            await self._start(self.muster)
        await remove_run(kube, self.ns, self.pool,
                         [key.split("/", 1)[1] for key in self.rec.current])
        self.muster.stop()
        self.standby.stop()
        # Anything Muster did not release (it should have): the run's nodes go.
        listing = await kube.list(NODES, label_selector=f"{fake.TAG_POOL}={self.pool}")
        for node in listing.get("items") or []:
            with contextlib.suppress(ApiError):
                await kube.delete(NODES, node["metadata"]["name"])

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Chaos]:
        """The run's objects and watches; on exit, the settled checks (into
        :attr:`result`) and the clean-up. For scenarios composed elsewhere (the tests)."""
        self.kube = await KubeClient.from_kubeconfig(self.cluster.admin_kubeconfig)
        watcher: asyncio.Task[None] | None = None
        try:
            await self.setup()
            watcher = asyncio.create_task(self.watch())
            yield self
            await self.settle_and_check()
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            try:
                if self.opts.keep and self.result.violations:
                    log(f"violations: keeping namespace {self.ns} and pool {self.pool}")
                    self.muster.stop()
                    self.standby.stop()
                else:
                    await self.cleanup()
            finally:
                await self.kube.close()

    async def main(self) -> Result:
        # SIGINT/SIGTERM end the crashing: the checks and the clean-up still run.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with self.session():
            deadline = time.monotonic() + self.opts.max_minutes * 60
            round_ = 0
            while (self.result.crashes < self.opts.crashes and time.monotonic() < deadline
                   and not stop.is_set()):
                round_ += 1
                if self.opts.apiserver_every and round_ % self.opts.apiserver_every == 0:
                    await self.apiserver_round()
                elif self.opts.failover_every and round_ % self.opts.failover_every == 0:
                    await self.failover_round()
                else:
                    await self.crash_round()
                if round_ % 25 == 0:
                    log(f"{self.result.line()} ({dict(self.result.planned)})")
        return self.result


def parse(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(prog="python3 -m e2e.chaos",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--crashes", type=int, default=20, help="stop after this many")
    parser.add_argument("--max-minutes", type=float, default=10.0,
                        help="stop crashing after this long, whatever the count")
    parser.add_argument("--failover-every", type=int, default=0, metavar="N",
                        help="every Nth round: two replicas, the leader killed mid-acquisition")
    parser.add_argument("--apiserver-every", type=int, default=0, metavar="N",
                        help="every Nth round: kube-apiserver restarted mid-run")
    parser.add_argument("--faults", action="store_true",
                        help="the fake provider's injected faults on the pool all along")
    parser.add_argument("--settle", type=float, default=45.0,
                        help="seconds Muster runs undisturbed before the checks")
    parser.add_argument("--arrivals", type=int, default=3, help="requests created per round")
    parser.add_argument("--keep", action="store_true",
                        help="on violations, leave the run's objects for a look")
    parser.add_argument("--cycle-steps", action="store_true",
                        help="crash at each named step in turn instead of at random ones")
    a = parser.parse_args(argv)
    return Options(seed=a.seed, crashes=a.crashes, max_minutes=a.max_minutes,
                   failover_every=a.failover_every, apiserver_every=a.apiserver_every,
                   faults=a.faults, settle=a.settle, arrivals=a.arrivals,
                   cycle_steps=a.cycle_steps, keep=a.keep)


@contextlib.contextmanager
def _cluster_up() -> Iterator[cp.Cluster]:
    cluster = cp.default_cluster()
    was_up = cp.running(cluster)
    cp.up(cluster)
    try:
        yield cluster
    finally:
        if not was_up and not os.environ.get("MUSTER_KEEP_CLUSTER"):
            cp.down(cluster)


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    with _cluster_up() as cluster:
        result = asyncio.run(Chaos(cluster, opts).main())
    for v in result.violations[:50]:
        print(f"violation: {v}")
    print(f"crashes by kind: {json.dumps(dict(result.planned), sort_keys=True)}; "
          f"failovers {result.failovers}, apiserver restarts {result.apiserver_restarts}")
    print(f"requests at the end: {json.dumps(dict(result.outcomes), sort_keys=True)}; "
          f"nodes created {result.nodes_created}")
    for line in result.revoked[:20]:
        print(f"revoked: {line}")
    print(result.line(), flush=True)
    return 0 if not result.violations else 1


if __name__ == "__main__":
    sys.exit(main())
