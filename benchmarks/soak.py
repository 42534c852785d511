"""Soak: steady arrivals and deletions on the real control plane, Muster's memory and API
request rate sampled; both should stay flat.

    python3 -m benchmarks.soak --minutes 30 [--rate 0.5] [--lifetime 40] [--sample 30]

Starts the local control plane (:mod:`e2e.cluster`, reused when up) and ``muster run`` as its
own process under its ServiceAccount (:class:`e2e.real.MusterProcess`, config
``e2e/muster-chaos.yaml``: bookings of 6 s, idle TTL 1 s). Every ``1/rate`` seconds a
ProvisioningRequest for 1-3 8-GPU workers in one rack arrives (new nodes from a fake-provider
pool); each is deleted ``--lifetime`` seconds after its creation, so the number of live
requests, bookings and nodes is steady. Every ``--sample`` seconds it records:

* the controller's resident memory (``VmRSS`` of the process, /proc);
* Muster's API request rate: requests the API server dispatched for the
  ``service-accounts`` flow schema (API priority and fairness,
  ``apiserver_flowcontrol_dispatched_requests_total``; on this cluster only Muster talks as a
  ServiceAccount outside kube-system: the controller-manager's are ``kube-system`` ones,
  kwok, the scheduler and Kueue use the admin certificate);
* requests created, Provisioned, deleted.

At the end it prints the samples, the least-squares slope of each series over the second
half of the run (after warm-up) in units per hour, and one line
``soak minutes=M requests=N rss_mb=<first>..<last> rss_slope_mb_per_h=S
api_per_s=<mean> api_slope_per_s_per_h=T``. ``--json PATH`` writes the samples.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from controller.commands import objects
from controller.kube import ApiError, KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    NAMESPACES,
    POD_TEMPLATES,
    PROVISIONING_REQUESTS,
)
from e2e import cluster as cp
from e2e.chaos import CHAOS_CONFIG, conditions, remove_run
from e2e.real import MusterProcess

FLOW_SCHEMA = "service-accounts"
_DISPATCHED = re.compile(
    r'^apiserver_flowcontrol_dispatched_requests_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


@dataclass
class Sample:
    t: float
    """Seconds since the start."""
    rss_mb: float
    api_total: float
    """Requests dispatched for Muster's flow schema so far."""
    api_per_s: float
    """Over the interval since the previous sample."""
    created: int
    provisioned: int
    deleted: int
    live: int


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, in value units per hour."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return sxy / sxx * 3600.0


def dispatched(metrics: str, flow_schema: str = FLOW_SCHEMA) -> float:
    """Requests the API server dispatched for ``flow_schema`` (summed over levels)."""
    total = 0.0
    for line in metrics.splitlines():
        m = _DISPATCHED.match(line)
        if m and f'flow_schema="{flow_schema}"' in m["labels"]:
            total += float(m["value"])
    return total


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


class Soak:
    def __init__(self, cluster: cp.Cluster, *, minutes: float, rate: float, lifetime: float,
                 sample: float, seed: int) -> None:
        self.cluster = cluster
        self.minutes = minutes
        self.rate = rate
        self.lifetime = lifetime
        self.sample_every = sample
        self.rng = random.Random(seed)
        self.run = uuid.uuid4().hex[:6]
        self.ns = f"soak-{self.run}"
        self.pool = f"soak-{self.run}"
        self.muster = MusterProcess(cluster, config=CHAOS_CONFIG, extra_env={
            "MUSTER_LEADER_ELECTION__ENABLED": "false", "MUSTER_KUEUE__ENABLED": "false"})
        self.created: dict[str, float] = {}
        self.provisioned: set[str] = set()
        self.deleted = 0
        self.samples: list[Sample] = []

    async def metrics(self, kube: KubeClient) -> float:
        proc = await asyncio.create_subprocess_exec(
            "kubectl", f"--kubeconfig={self.cluster.admin_kubeconfig}", "get", "--raw",
            "/metrics", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        out, _ = await proc.communicate()
        return dispatched(out.decode())

    async def main(self) -> list[Sample]:
        kube = await KubeClient.from_kubeconfig(self.cluster.admin_kubeconfig)
        try:
            await self.setup(kube)
            self.muster.start()
            try:
                await self.loop(kube)
            finally:
                await self.cleanup(kube)
                self.muster.stop()
        finally:
            await kube.close()
        return self.samples

    async def setup(self, kube: KubeClient) -> None:
        await kube.create(NAMESPACES, {"metadata": {"name": self.ns}})
        pool = objects.gpu_pool(self.pool, blocks=2, racks_per_block=4, nodes_per_rack=8,
                                max_nodes=64)
        pool["spec"]["nodeTemplate"]["labels"]["soak.muster.dev/run"] = self.run
        await kube.create(CAPACITY_POOLS, pool)
        body = objects.pod_template(
            "w8", namespace=self.ns, requests={"cpu": "1", "memory": "1Gi", objects.GPU: "8"},
            required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
            node_selector={"soak.muster.dev/run": self.run})
        await kube.create(POD_TEMPLATES, body, namespace=self.ns)

    async def loop(self, kube: KubeClient) -> None:
        start = time.monotonic()
        end = start + self.minutes * 60
        next_arrival = start
        next_sample = start
        seq = 0
        last_api: tuple[float, float] | None = None
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_arrival:
                seq += 1
                name = f"r{seq}"
                body = objects.provisioning_request(
                    name, pod_sets=[("w8", self.rng.randint(1, 3))], namespace=self.ns)
                with contextlib.suppress(ApiError):
                    await kube.create(PROVISIONING_REQUESTS, body, namespace=self.ns)
                    self.created[name] = now
                next_arrival += 1.0 / self.rate
            for name, born in list(self.created.items()):
                if now - born >= self.lifetime:
                    await self.note_outcome(kube, name)
                    with contextlib.suppress(ApiError):
                        await kube.delete(PROVISIONING_REQUESTS, name, namespace=self.ns)
                    del self.created[name]
                    self.deleted += 1
            if now >= next_sample:
                api = await self.metrics(kube)
                rate = 0.0
                if last_api is not None and now > last_api[0]:
                    rate = (api - last_api[1]) / (now - last_api[0])
                last_api = (now, api)
                assert self.muster.proc is not None
                if self.muster.proc.poll() is not None:
                    raise RuntimeError(f"muster run exited {self.muster.proc.returncode}:\n"
                                       f"{self.muster.tail()}")
                s = Sample(t=round(now - start, 1), rss_mb=round(rss_mb(self.muster.proc.pid), 1),
                           api_total=api, api_per_s=round(rate, 2), created=seq,
                           provisioned=len(self.provisioned), deleted=self.deleted,
                           live=len(self.created))
                self.samples.append(s)
                print(json.dumps(asdict(s)), file=sys.stderr, flush=True)
                next_sample += self.sample_every
            await asyncio.sleep(min(next_arrival, next_sample) - time.monotonic())

    async def note_outcome(self, kube: KubeClient, name: str) -> None:
        with contextlib.suppress(ApiError):
            body = await kube.get(PROVISIONING_REQUESTS, name, namespace=self.ns)
            for t in ("Provisioned", "BookingExpired"):
                if conditions(body).get(t, {}).get("status") == "True":
                    self.provisioned.add(name)

    async def cleanup(self, kube: KubeClient) -> None:
        await remove_run(kube, self.ns, self.pool, list(self.created), release_within=120)


def report(samples: list[Sample], minutes: float) -> str:
    half = [s for s in samples if s.t >= samples[-1].t / 2] if samples else []
    rss = slope_per_hour([(s.t, s.rss_mb) for s in half])
    api_points = [(s.t, s.api_per_s) for s in half if s.api_per_s > 0]
    api = slope_per_hour(api_points)
    mean_api = sum(y for _, y in api_points) / len(api_points) if api_points else 0.0
    created = samples[-1].created if samples else 0
    first = samples[0].rss_mb if samples else 0.0
    last = samples[-1].rss_mb if samples else 0.0
    return (f"soak minutes={minutes:g} requests={created} rss_mb={first:.0f}..{last:.0f} "
            f"rss_slope_mb_per_h={rss:.1f} api_per_s={mean_api:.2f} "
            f"api_slope_per_s_per_h={api:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.soak",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=0.5, help="arrivals per second")
    parser.add_argument("--lifetime", type=float, default=40.0,
                        help="seconds from a request's creation to its deletion")
    parser.add_argument("--sample", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the samples here")
    args = parser.parse_args(argv)
    cluster = cp.default_cluster()
    was_up = cp.running(cluster)
    cp.up(cluster)
    try:
        samples = asyncio.run(Soak(cluster, minutes=args.minutes, rate=args.rate,
                                   lifetime=args.lifetime, sample=args.sample,
                                   seed=args.seed).main())
    finally:
        if not was_up:
            cp.down(cluster)
    if args.json:
        args.json.write_text(json.dumps([asdict(s) for s in samples], indent=1))
    print("t_s rss_mb api_per_s created provisioned deleted live")
    for s in samples:
        print(f"{s.t:.0f} {s.rss_mb} {s.api_per_s} {s.created} {s.provisioned} {s.deleted} "
              f"{s.live}")
    print(report(samples, args.minutes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
