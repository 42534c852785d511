"""The real kube-scheduler as the oracle for Muster's fit engine (issue 13, item 2).

For each seeded case of :mod:`e2e.parity_cases` (a small cluster of existing nodes, pods
already running on them, and a gang), Muster is asked in check mode whether the gang fits
(``muster fit --mode check --json``, in-process); then, on a real control plane, the nodes
are created (kwok-managed, Ready; the runner waits for the node lifecycle controller to lift
the ``node.kubernetes.io/not-ready`` taint that the API server's admission puts on every new
node, and to make the pressure taints follow the nodes' conditions), the running pods are
created bound, and the gang's pods are created for the default scheduler. The scheduler's
answer is "fits" when it binds every pod, "does not fit" when every pod it did not bind
carries ``PodScheduled=False`` with reason ``Unschedulable`` and nothing changes for
``--settle`` seconds (a pod the scheduler rejected may be retried after a later event; the
settle time lets such a retry happen). The two answers agree when they are equal.

* A case Muster **refuses** (it names a constraint it does not plan, ``REFUSED``) is counted
  and not run: those are documented limits (docs/design/filter-parity.md), not agreements.
* A case with **node-name** pods (``spec.nodeName``) is counted as **excluded** and not run:
  no scheduler places such a pod, the node's kubelet admits or rejects it, and kwok (this
  cluster's kubelet) admits every pod, so the cluster cannot judge Muster's answer there.
* A case the scheduler did not decide within ``--timeout`` is **undecided** (a failure of the
  run, not an agreement).

Cases share the cluster: every node is labelled with its case and every pod selects its
case's label, so a case's pods see only its own nodes; each case gets its own namespace
(``<case id>-<run>``). Cases run ``--concurrency`` at a time, except a case whose spread
constraint has ``nodeAffinityPolicy: Ignore``: it counts every node of the cluster, so it
runs alone, once no other node is left. Every case cleans up after itself (pods deleted at
once, then its nodes and namespace). Run one oracle at a time per cluster, on a cluster
with no other nodes.

``python3 -m e2e.scheduler_oracle --seed 0 --count 500 [--kubeconfig PATH]`` prints the
disagreements, a per-field table and one final line
``scheduler_oracle cases=N agree=A disagree=D refused=R excluded=E undecided=U
known_limits=K`` (K of the D disagreements fall under a documented limit: Muster said "fits"
for several pod sets, or for a pod set with affinity to itself, whose placement the
scheduler's scores decide; docs/design/filter-parity.md). It exits 1 on any other disagreement
or an undecided case. Without
``--kubeconfig`` it uses the control plane of :mod:`e2e.cluster` (``MUSTER_CLUSTER_STATE``,
``MUSTER_CLUSTER_PORT_BASE``), which must be up (``python3 -m e2e.cluster up``). ``--only``
reruns single cases by index; ``--out FILE`` writes one JSON line per case.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller.kube import ApiError, Body, KubeClient, whole_listing
from controller.kube.client import WatchEvent
from controller.kube.resources import NAMESPACES, NODES, PODS, Resource
from e2e.parity_cases import CASE_LABEL, FIELDS, Answer, Case, case, muster_answer

SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", namespaced=True, kind="ServiceAccount")
NOT_READY = "node.kubernetes.io/not-ready"
RUN_LABEL = "parity.muster.dev/run"

AGREE, DISAGREE, REFUSED, EXCLUDED, UNDECIDED = (
    "agree", "disagree", "refused", "excluded", "undecided")
VERDICTS = (AGREE, DISAGREE, REFUSED, EXCLUDED, UNDECIDED)

EXCLUDED_FIELDS = {
    "node-name": "spec.nodeName pods are admitted by the kubelet, not scheduled, and kwok "
                 "admits every pod",
}

KNOWN_LIMITS = {
    # Muster says "fits" where the scheduler's scores, which Muster does not model, may
    # strand pods (docs/design/filter-parity.md, "Limits"). Only that direction is a known limit.
    "pod-sets": "several pod sets compete for nodes in the scheduler's order",
    "pod-affinity": "the scheduler's scores choose the domain of the pod set's first pod",
}


@dataclass
class Outcome:
    case: Case
    answer: Answer
    verdict: str
    scheduler_fits: bool | None = None
    pods: dict[str, str] = field(default_factory=dict)
    """Gang pod -> the node it was bound to, or ``Unschedulable: <message>`` / ``pending``."""
    detail: str = ""
    seconds: float = 0.0

    @property
    def known_limit(self) -> str | None:
        """The documented limit this disagreement falls under, if any."""
        if self.verdict != DISAGREE or not self.answer.fits or self.scheduler_fits:
            return None
        return next((why for f, why in KNOWN_LIMITS.items() if f in self.case.fields), None)

    def line(self) -> Body:
        return {
            "case": self.case.id, "fields": list(self.case.fields), "verdict": self.verdict,
            "known_limit": self.known_limit,
            "muster_fits": self.answer.fits, "muster_refused": self.answer.refused,
            "muster_reasons": list(self.answer.reasons), "scheduler_fits": self.scheduler_fits,
            "pods": self.pods, "detail": self.detail, "seconds": round(self.seconds, 2),
        }


# ---------------------------------------------------------------------------- the cluster


class Store:
    """Pods and the parity nodes as the watches last saw them; waiters are woken on change."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], Body] = {}
        self.nodes: dict[str, Body] = {}
        self._changed = asyncio.Event()
        self.synced = asyncio.Event()
        self._syncs = 0

    def _bump(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    @staticmethod
    def _pod_key(pod: Body) -> tuple[str, str]:
        meta = pod["metadata"]
        return str(meta.get("namespace", "")), str(meta["name"])

    def sync_pods(self, items: list[Body]) -> None:
        self.pods = {self._pod_key(p): p for p in items}
        self._synced()

    def sync_nodes(self, items: list[Body]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in items}
        self._synced()

    def _synced(self) -> None:
        self._syncs += 1
        if self._syncs >= 2:
            self.synced.set()
        self._bump()

    def pod_event(self, ev: WatchEvent) -> None:
        key = self._pod_key(ev.object)
        if ev.type == "DELETED":
            self.pods.pop(key, None)
        else:
            self.pods[key] = ev.object
        self._bump()

    def node_event(self, ev: WatchEvent) -> None:
        name = ev.object["metadata"]["name"]
        if ev.type == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = ev.object
        self._bump()

    async def wait_for(self, probe: Callable[[], Any], within: float) -> Any:
        """``probe()`` once it is truthy, or its last (falsy) value after ``within`` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not (value := probe()):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return value
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)
        return value


CONDITION_TAINTS = {
    # condition type, the status that taints -> the taint the node lifecycle controller keeps
    ("Ready", "False"): NOT_READY,
    ("Ready", "Unknown"): "node.kubernetes.io/unreachable",
    ("MemoryPressure", "True"): "node.kubernetes.io/memory-pressure",
    ("DiskPressure", "True"): "node.kubernetes.io/disk-pressure",
    ("PIDPressure", "True"): "node.kubernetes.io/pid-pressure",
    ("NetworkUnavailable", "True"): "node.kubernetes.io/network-unavailable",
}
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"


def _node_settled(node: Body | None) -> bool:
    """Ready, and its NoSchedule condition taints are what the node lifecycle controller
    makes of its conditions (it adds the API server's ``not-ready`` taint to every new node,
    then lifts it; it adds and removes pressure taints as the conditions say)."""
    if node is None:
        return False
    conditions = {c.get("type"): c.get("status")
                  for c in (node.get("status") or {}).get("conditions") or []}
    if conditions.get("Ready") != "True":
        return False
    want = {taint for (kind, status), taint in CONDITION_TAINTS.items()
            if conditions.get(kind) == status}
    if node.get("spec", {}).get("unschedulable"):
        want.add(UNSCHEDULABLE)
    managed = {*CONDITION_TAINTS.values(), UNSCHEDULABLE}
    have = {t.get("key") for t in node.get("spec", {}).get("taints") or []
            if t.get("key") in managed and t.get("effect") == "NoSchedule"}
    return have == want


def _pod_state(pod: Body | None) -> str:
    """The node a pod is bound to, ``Unschedulable: <message>``, or ``pending``."""
    if pod is None:
        return "missing"
    node = pod.get("spec", {}).get("nodeName")
    if node:
        return str(node)
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type") == "PodScheduled" and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"):
            return f"Unschedulable: {cond.get('message', '')}"
    return "pending"


@dataclass
class Oracle:
    kube: KubeClient
    store: Store
    run: str
    timeout: float = 60.0
    settle: float = 5.0

    # ------------------------------------------------------------------ one case

    async def judge(self, case: Case, answer: Answer) -> Outcome:
        excluded = [f for f in case.fields if f in EXCLUDED_FIELDS]
        if answer.refused:
            return Outcome(case, answer, REFUSED, detail="; ".join(answer.reasons))
        if excluded:
            return Outcome(case, answer, EXCLUDED, detail=EXCLUDED_FIELDS[excluded[0]])
        start = time.monotonic()
        namespace = f"{case.namespace}-{self.run}"
        try:
            outcome = await self._on_cluster(case, answer, namespace)
        finally:
            await self._cleanup(case, namespace)
        outcome.seconds = time.monotonic() - start
        return outcome

    async def _on_cluster(self, case: Case, answer: Answer, namespace: str) -> Outcome:
        await self.kube.create(NAMESPACES, {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {RUN_LABEL: self.run}}})
        nodes = case.nodes()
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for node in nodes:
            node["metadata"]["labels"][RUN_LABEL] = self.run
            for cond in node["status"]["conditions"]:
                cond.setdefault("lastHeartbeatTime", now)
                cond.setdefault("lastTransitionTime", now)
        await asyncio.gather(*(self._create_node(n) for n in nodes))
        names = [n["metadata"]["name"] for n in nodes]
        ready = await self.store.wait_for(
            lambda: all(_node_settled(self.store.nodes.get(n)) for n in names), self.timeout)
        if not ready:
            return Outcome(case, answer, UNDECIDED, detail="the nodes' condition taints never "
                           "settled (node lifecycle controller)")
        await self._service_account(namespace)
        # Running pods first: the scheduler's pod informer sees them (bound, holding their
        # requests) before the gang's pods, as one watch stream keeps creation order.
        for pod in case.running():
            pod["metadata"]["namespace"] = namespace
            await self.kube.create(PODS, pod, namespace=namespace)
        gang = case.pods()
        for pod in gang:  # in pod-set order, as a job controller would
            pod["metadata"]["namespace"] = namespace
            await self.kube.create(PODS, pod, namespace=namespace)
        keys = [(namespace, p["metadata"]["name"]) for p in gang]
        return await self._verdict(case, answer, keys)

    async def _verdict(self, case: Case, answer: Answer, keys: list[tuple[str, str]]
                       ) -> Outcome:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout

        def states() -> dict[str, str]:
            return {k[1]: _pod_state(self.store.pods.get(k)) for k in keys}

        def decided() -> dict[str, str] | None:
            now = states()
            if all(s != "pending" and s != "missing" for s in now.values()):
                return now
            return None

        def changed_from(before: dict[str, str]) -> Callable[[], bool]:
            return lambda: states() != before

        while True:
            seen = await self.store.wait_for(decided, max(0.0, deadline - loop.time()))
            if not seen:
                return Outcome(case, answer, UNDECIDED, pods=states(),
                               detail=f"the scheduler did not decide in {self.timeout:g}s")
            bound = all(not s.startswith("Unschedulable") for s in seen.values())
            if bound:
                break
            # Every unbound pod was found Unschedulable once; a later event may make the
            # scheduler retry it. Judge only when nothing changes for the settle time.
            changed = await self.store.wait_for(changed_from(seen),
                                                min(self.settle, deadline - loop.time()))
            if not changed:
                break
        fits = all(not s.startswith("Unschedulable") for s in seen.values())
        verdict = AGREE if fits == answer.fits else DISAGREE
        return Outcome(case, answer, verdict, scheduler_fits=fits, pods=seen)

    async def _create_node(self, node: Body) -> None:
        try:
            await self.kube.create(NODES, node)
        except ApiError as exc:
            if not exc.conflict:
                raise
            # Left over from an interrupted run: replace it.
            await self.kube.delete(NODES, node["metadata"]["name"])
            await self.store.wait_for(
                lambda: node["metadata"]["name"] not in self.store.nodes, 30)
            await self.kube.create(NODES, node)

    async def _service_account(self, namespace: str) -> None:
        """Pods are refused until the service-account controller made ``default``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while await self.kube.get_or_none(SERVICE_ACCOUNTS, "default",
                                          namespace=namespace) is None:
            if loop.time() > deadline:
                raise TimeoutError(f"no ServiceAccount default in {namespace}")
            await asyncio.sleep(0.2)

    async def _cleanup(self, case: Case, namespace: str) -> None:
        with contextlib.suppress(ApiError):
            # Grace period 0: gone from the store at once (kwok need not finish them), so the
            # nodes can go next without orphaning pods.
            await self.kube._request("DELETE", PODS.path(namespace=namespace),
                                     query={"gracePeriodSeconds": 0})
        for node in case.node_objects:
            with contextlib.suppress(ApiError):
                await self.kube.delete(NODES, node["metadata"]["name"])
        with contextlib.suppress(ApiError):
            await self.kube.delete(NAMESPACES, namespace)

    # ------------------------------------------------------------------ all cases

    async def judge_all(self, cases: Iterable[Case], *, concurrency: int,
                        progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
        gate = _Gate(concurrency)

        async def one(case: Case) -> Outcome:
            alone = cluster_wide(case)
            async with gate.slot(alone):
                # Muster's answer in-process (CPU-bound: it blocks this loop briefly).
                answer = muster_answer(case)
                try:
                    if alone and not answer.refused:
                        await self._alone(case)
                    outcome = await self.judge(case, answer)
                except (ApiError, TimeoutError) as exc:
                    outcome = Outcome(case, answer, UNDECIDED, detail=f"error: {exc}")
            if progress:
                progress(outcome)
            return outcome

        return list(await asyncio.gather(*(one(c) for c in cases)))

    async def _alone(self, case: Case) -> None:
        """Wait until no other node is in the cluster (those of the cases that just ended
        are being deleted)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            listing = await self.kube.list(NODES)
            others = [n["metadata"]["name"] for n in listing.get("items") or []
                      if n["metadata"].get("labels", {}).get(CASE_LABEL) != case.id]
            if not others:
                return
            if loop.time() > deadline:
                raise TimeoutError(f"a cluster-wide case needs the cluster to itself; other "
                                   f"nodes stay: {others[:5]}")
            await asyncio.sleep(0.5)

    async def namespaces_left(self, within: float = 90.0) -> list[str]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            listing = await self.kube.list(NAMESPACES, label_selector=f"{RUN_LABEL}={self.run}")
            left = [n["metadata"]["name"] for n in listing.get("items") or []]
            if not left or loop.time() > deadline:
                return left
            await asyncio.sleep(1.0)


def cluster_wide(case: Case) -> bool:
    """A spread constraint with ``nodeAffinityPolicy: Ignore`` counts domains of every node
    in the cluster, not only the case's (its node selector no longer limits them): such a
    case runs alone, on a cluster with no other node."""
    return any(tsc.get("nodeAffinityPolicy") == "Ignore"
               for t in case.templates
               for tsc in t["template"]["spec"].get("topologySpreadConstraints") or [])


class _Gate:
    """``concurrency`` slots; a case that needs the cluster alone takes them all (and cases
    arriving after it wait for it)."""

    def __init__(self, slots: int) -> None:
        self.slots = self.free = slots
        self.alone_waiting = 0
        self.cond = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def slot(self, alone: bool) -> AsyncIterator[None]:
        need = self.slots if alone else 1
        async with self.cond:
            self.alone_waiting += alone
            await self.cond.wait_for(
                lambda: self.free >= need and (alone or not self.alone_waiting))
            self.alone_waiting -= alone
            self.free -= need
        try:
            yield
        finally:
            async with self.cond:
                self.free += need
                self.cond.notify_all()


async def oracle(cases: Iterable[Case], kubeconfig: Path, *, concurrency: int = 12,
                 case_timeout: float = 60.0, settle: float = 5.0,
                 progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Judge every case on the cluster ``kubeconfig`` names; outcomes in case order."""
    store = Store()
    async with await KubeClient.from_kubeconfig(kubeconfig) as kube:
        watches = [
            asyncio.create_task(kube.watch(PODS, whole_listing(store.sync_pods), store.pod_event)),
            asyncio.create_task(kube.watch(NODES, whole_listing(store.sync_nodes), store.node_event,
                                           label_selector=CASE_LABEL)),
        ]
        try:
            await asyncio.wait_for(store.synced.wait(), 30)
            run = uuid.uuid4().hex[:6]
            judge = Oracle(kube, store, run, timeout=case_timeout, settle=settle)
            outcomes = await judge.judge_all(cases, concurrency=concurrency,
                                             progress=progress)
            left = await judge.namespaces_left()
            if left:
                print(f"warning: namespaces not yet deleted: {left[:5]}", file=sys.stderr)
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
    return outcomes


# ---------------------------------------------------------------------------- the report


def tally(outcomes: list[Outcome]) -> dict[str, int]:
    counts = dict.fromkeys(VERDICTS, 0)
    for o in outcomes:
        counts[o.verdict] += 1
    return counts


def per_field(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    """Field -> verdict counts over the cases exercising it (a case counts for every field)."""
    table = {f: dict.fromkeys(VERDICTS, 0) for f in FIELDS}
    for o in outcomes:
        for f in o.case.fields:
            table.setdefault(f, dict.fromkeys(VERDICTS, 0))[o.verdict] += 1
    return table


def known(outcomes: list[Outcome]) -> int:
    """Disagreements that fall under a documented limit (:data:`KNOWN_LIMITS`)."""
    return sum(1 for o in outcomes if o.known_limit)


def summary(outcomes: list[Outcome]) -> str:
    c = tally(outcomes)
    return (f"scheduler_oracle cases={len(outcomes)} agree={c[AGREE]} "
            f"disagree={c[DISAGREE]} refused={c[REFUSED]} excluded={c[EXCLUDED]} "
            f"undecided={c[UNDECIDED]} known_limits={known(outcomes)}")


def failed(outcomes: list[Outcome]) -> bool:
    """A disagreement outside the documented limits, or a case left undecided."""
    c = tally(outcomes)
    return c[DISAGREE] > known(outcomes) or c[UNDECIDED] > 0


def report(outcomes: list[Outcome]) -> list[str]:
    lines = []
    for o in outcomes:
        if o.verdict in (DISAGREE, UNDECIDED):
            limit = f" (known limit: {o.known_limit})" if o.known_limit else ""
            lines.append(f"{o.verdict.upper()}{limit} {o.case.id} "
                         f"fields={','.join(o.case.fields)} "
                         f"muster={'fits' if o.answer.fits else 'no fit'} "
                         f"scheduler={_fits_word(o.scheduler_fits)} {o.detail}".rstrip())
            lines.extend(f"    muster: {r}" for r in o.answer.reasons)
            lines.extend(f"    pod {name}: {state}" for name, state in o.pods.items())
    lines.append(f"{'field':<22} {'judged':>6} {'agree':>6} {'rate':>7} {'refused':>7} "
                 f"{'excluded':>8} {'undecided':>9}")
    for name, c in per_field(outcomes).items():
        judged = c[AGREE] + c[DISAGREE]
        rate = f"{100 * c[AGREE] / judged:.1f}%" if judged else "-"
        lines.append(f"{name:<22} {judged:>6} {c[AGREE]:>6} {rate:>7} {c[REFUSED]:>7} "
                     f"{c[EXCLUDED]:>8} {c[UNDECIDED]:>9}")
    c = tally(outcomes)
    judged = c[AGREE] + c[DISAGREE]
    fits = sum(1 for o in outcomes if o.verdict in (AGREE, DISAGREE) and o.scheduler_fits)
    lines.append(f"judged {judged}: the scheduler bound every pod in {fits}, not in "
                 f"{judged - fits}; agreement "
                 f"{100 * c[AGREE] / judged if judged else 0:.1f}%")
    lines.append(summary(outcomes))
    return lines


def _fits_word(fits: bool | None) -> str:
    return "?" if fits is None else "fits" if fits else "no fit"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m e2e.scheduler_oracle",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--only", default="", help="comma-separated case indexes to run")
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="the cluster (default: e2e.cluster's admin kubeconfig)")
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds a case may take on the cluster")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds without change before an unbound gang is judged")
    parser.add_argument("--out", type=Path, default=None, help="one JSON line per case")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    if args.kubeconfig is None:
        from e2e import cluster as cp

        cluster = cp.default_cluster()
        if not cp.running(cluster):
            print("scheduler_oracle: no cluster; run python3 -m e2e.cluster up first "
                  "(or pass --kubeconfig)", file=sys.stderr)
            return 2
        args.kubeconfig = cluster.admin_kubeconfig
    indexes = ([int(i) for i in args.only.split(",") if i.strip()] if args.only
               else list(range(args.count)))
    cases = [case(args.seed, i) for i in indexes]
    done = [0]
    started = time.monotonic()

    def progress(o: Outcome) -> None:
        done[0] += 1
        if not args.quiet:
            print(f"[{done[0]}/{len(cases)} {time.monotonic() - started:.0f}s] {o.case.id} "
                  f"{o.verdict}", file=sys.stderr, flush=True)

    outcomes = asyncio.run(oracle(cases, args.kubeconfig, concurrency=args.concurrency,
                                  case_timeout=args.timeout, settle=args.settle,
                                  progress=progress))
    if args.out:
        args.out.write_text("".join(json.dumps(o.line()) + "\n" for o in outcomes))
    print(f"seed {args.seed}, {len(cases)} cases, {time.monotonic() - started:.0f} s")
    for line in report(outcomes):
        print(line)
    return 1 if failed(outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
