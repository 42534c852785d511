"""Karpenter's scheduling benchmark and Muster's ``controller.fit.plan`` on the same pods and
catalogue, side by side (run on demand: ``python3 -m benchmarks.karpenter_side_by_side``).

Karpenter: ``BenchmarkScheduling<N>``'s loop (an empty cluster, one NodePool,
``fake.InstanceTypes(400)``: instance type i has i+1 CPUs, 2(i+1) GiB, 10(i+1) pods, offered in
test-zone-1..3, priced 0.1 per CPU plus 0.1 per GB) built from Karpenter's Go module by
``benchmarks/karpenter/build.sh`` with one added benchmark, ``BenchmarkSchedulingMix``, that
takes the pod count and mix from the environment, writes the pods it generated to a file and
reports process CPU per Solve, the first plan's nodes and their hourly price.

Muster: the very same pods mapped to one gang, planned against one CapacityPool per instance
type (same allocatable: capacity less the fake's kube-reserved; same price) with three zone
domains, levels zone and hostname:

* generic pods: one pod set per distinct request, no constraint;
* zone or hostname spread (maxSkew 1, DoNotSchedule): one pod set per selector, with that
  spread among its own pods (Karpenter also counts other pods carrying the selected label);
* zone self-affinity: one pod set per label value, required in one zone;
* hostname anti-affinity (every such pod repels every other): one pod set, one pod per node.

A pod set has one shape, so a pod set gathering pods of different requests asks for each of
its pods the largest request of the group: never easier than Karpenter's pods, sometimes
costlier. Where Muster refuses a gang Karpenter plans, the row says so (with the reason) and
no substitute is planned.

Runs are alternated per case (Karpenter, then each Muster tree), CPU time on both sides.
``--muster DIR`` (repeatable) plans with the ``controller`` package of another checkout, e.g.
``main`` beside this branch, each in its own process. Per case: pods/s of both, the ratio
(Muster / Karpenter), nodes and hourly cost of both plans. Last lines: the worst ratio per
Muster tree, the last ``--muster`` tree's last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "benchmarks" / "karpenter" / "build.sh"
SIZES = (1, 8, 64, 1000, 5000)
MIXES = (
    "diverse",
    "plain",
    "zone-spread",
    "hostname-spread",
    "zone-affinity",
    "hostname-anti-affinity",
)
ZONE, HOSTNAME = "topology.kubernetes.io/zone", "kubernetes.io/hostname"
ZONES = ("test-zone-1", "test-zone-2", "test-zone-3")
INSTANCE_TYPES = 400
GIB = 2**30
MIB = 2**20


# ------------------------------------------------------------------ Muster side (worker)


def catalogue(fit: Any) -> Any:
    """fake.InstanceTypes(400) as CapacityPools: allocatable is capacity less the fake's
    kube-reserved (100m CPU, 10Mi); price is PriceFromResources (0.1/CPU + 0.1/GB)."""
    pools = []
    for i in range(INSTANCE_TYPES):
        cpu, mem, pods = i + 1, (i + 1) * 2 * GIB, (i + 1) * 10
        name = f"fake-it-{i}"
        domains = tuple(fit.PoolDomain({ZONE: z}, 1_000_000) for z in ZONES)
        pools.append(
            fit.PoolState(
                name,
                {"node.kubernetes.io/instance-type": name},
                (),
                {"cpu": cpu * 1000 - 100, "memory": mem - 10 * MIB, "pods": pods},
                domains,
                3_000_000,
                price_per_node_hour=0.1 * cpu + 0.1 * mem / 1e9,
            )
        )
    return fit.Snapshot((), tuple(pools), (ZONE, HOSTNAME))


def gang(fit: Any, pods: list[dict[str, Any]]) -> Any:
    """The pods as one gang (see the module docstring for the mapping)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for p in pods:
        kind, key = p["kind"], p["key"]
        if kind == "":
            gkey: tuple[Any, ...] = ("plain", p["cpu_m"], p["memory"])
        elif kind == "anti-affinity":
            gkey = (kind, key, tuple(sorted(p["selector"].items())))
        else:
            gkey = (kind, key, tuple(sorted(p["selector"].items())))
        groups.setdefault(gkey, []).append(p)
    pod_sets = []
    for n, (gkey, members) in enumerate(sorted(groups.items(), key=lambda kv: str(kv[0]))):
        requests = {
            "cpu": max(p["cpu_m"] for p in members),
            "memory": max(p["memory"] for p in members),
            "pods": 1,
        }
        kind = gkey[0]
        topo = fit.TopologyRequest()
        if kind == "plain":
            shape = fit.PodShape(requests)
        elif kind == "spread":
            shape = fit.PodShape(requests, spread=fit.Spread(gkey[1], 1))
        elif kind == "affinity":
            shape = fit.PodShape(requests)
            topo = fit.TopologyRequest(fit.TopologyMode.REQUIRED, gkey[1])
        else:
            if gkey[1] != HOSTNAME:
                raise SystemExit(f"no mapping for anti-affinity on {gkey[1]}")
            shape = fit.PodShape(requests, max_per_node=1)
        pod_sets.append(fit.PodSetRequest(f"ps{n:03d}-{kind}", len(members), shape, topo))
    return fit.GangRequest("bench/karpenter-mix", tuple(pod_sets))


def worker(path: str, min_cpu: float) -> None:
    """Plan the dumped pods (file ``path``) and print one JSON line: CPU per plan, outcome."""
    import controller.fit as fit

    pods = json.loads(Path(path).read_text())
    snap = catalogue(fit)
    request = gang(fit, pods)
    result = fit.plan(request, snap, fit.Mode.PROVISION)  # warm-up
    times: list[float] = []
    spent = 0.0
    while not times or (spent < min_cpu and len(times) < 1000):
        t0 = time.process_time()
        result = fit.plan(request, snap, fit.Mode.PROVISION)
        dt = time.process_time() - t0
        times.append(dt)
        spent += dt
    out: dict[str, Any] = {
        "cpu_s": statistics.median(times),
        "runs": len(times),
        "pod_sets": len(request.pod_sets),
        "controller": fit.__file__,
    }
    if isinstance(result, fit.Plan):
        out["nodes"] = sum(n.count for n in result.new_nodes)
        out["cost"] = result.cost_per_hour
    else:
        out["refused"] = "; ".join(f"{r.code}: {r.message}" for r in result.reasons)[:300]
    print(json.dumps(out))


# ------------------------------------------------------------------ driver


def karpenter(binary: str, pods: int, mix: str, dump: str, benchtime: str) -> dict[str, Any]:
    env = dict(
        os.environ,
        MUSTER_KARPENTER_PODS=str(pods),
        MUSTER_KARPENTER_MIX=mix,
        MUSTER_KARPENTER_DUMP=dump,
    )
    done = subprocess.run(
        [
            binary,
            "-test.run=^$",
            "-test.bench=^BenchmarkSchedulingMix$",
            f"-test.benchtime={benchtime}",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(binary).parent,
    )
    line = next(
        (ln for ln in done.stdout.splitlines() if ln.startswith("BenchmarkSchedulingMix")), ""
    )
    if done.returncode != 0 or not line:
        return {"error": (done.stdout + done.stderr).strip().splitlines()[-1:]}
    metrics = {unit: float(v) for v, unit in re.findall(r"([\d.e+]+) (\S+)", line)}
    return {
        "cpu_s": metrics["cpu-ns/op"] / 1e9,
        "nodes": int(metrics["nodes"]),
        "cost": metrics["usd/h"],
    }


def muster(tree: Path, dump: str, min_cpu: float) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            dump,
            "--min-cpu",
            str(min_cpu),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tree,
    )
    if done.returncode != 0:
        return {"error": (done.stdout + done.stderr).strip().splitlines()[-1:]}
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not got["controller"].startswith(str(tree)):
        raise SystemExit(f"{tree}: planned with {got['controller']}, not that tree")
    return got


def run_case(
    binary: str, trees: list[Path], pods: int, mix: str, tmp: str, args: argparse.Namespace
) -> list[tuple[float, str]]:
    """One row: Karpenter, then each Muster tree, on the same pods; (ratio, case) per tree."""
    dump = str(Path(tmp) / f"pods-{pods}-{mix}.json")
    k = karpenter(binary, pods, mix, dump, args.benchtime)
    if "error" in k:
        print(f"| {pods} | {mix} | Karpenter failed: {k['error']} |", flush=True)
        return []
    cells = [str(pods), mix, rate(pods, k["cpu_s"]), str(k["nodes"]), f"{k['cost']:.2f}"]
    notes: list[str] = []
    ratios: list[tuple[float, str]] = []
    for tree in trees:
        m = muster(tree, dump, args.min_cpu)
        if "error" in m:
            cells += ["failed", "", "", str(m["error"])]
            continue
        ratio = k["cpu_s"] / m["cpu_s"] if m["cpu_s"] > 0 else math.inf
        ratios.append((ratio, f"{tree.name},pods={pods},mix={mix}"))
        if "refused" in m:
            cells += [rate(pods, m["cpu_s"]), f"{ratio:.1f}x", "refused", "-"]
            notes.append(f"  {tree.name}: refused ({m['pod_sets']} pod sets): {m['refused']}")
            continue
        # Go prints metrics to 4 significant digits: equal plans differ below that.
        dearer = "" if m["cost"] <= k["cost"] * (1 + 1e-3) else " (costlier)"
        cells += [
            rate(pods, m["cpu_s"]),
            f"{ratio:.1f}x",
            str(m["nodes"]),
            f"{m['cost']:.2f}{dearer}",
        ]
    print("| " + " | ".join(cells) + " |", flush=True)
    for note in notes:
        print(note, flush=True)
    return ratios


def rate(pods: int, cpu_s: float) -> str:
    return f"{pods / cpu_s:,.0f}" if cpu_s > 0 else "inf"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument(
        "--muster",
        action="append",
        type=Path,
        help="a checkout whose controller package plans (default: this one)",
    )
    ap.add_argument("--benchtime", default="1s", help="go test -test.benchtime")
    ap.add_argument(
        "--min-cpu",
        type=float,
        default=0.5,
        help="Muster: plan until this much CPU (s) is spent (after one warm-up plan)",
    )
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.min_cpu)
        return 0
    built = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        print(built.stderr, file=sys.stderr)
        print(f"karpenter_side_by_side: {BUILD.relative_to(ROOT)} failed", file=sys.stderr)
        return 2
    binary = built.stdout.strip().splitlines()[-1]
    trees = [t.resolve() for t in (args.muster or [ROOT])]
    names = [t.name for t in trees]
    sizes = [int(s) for s in args.sizes.split(",")]
    mixes = args.mixes.split(",")
    for mix in mixes:
        if mix not in MIXES:
            ap.error(f"unknown mix {mix} (one of {', '.join(MIXES)})")
    print(f"Karpenter: {binary}")
    print(
        "| pods | mix | Karpenter pods/s | nodes | $/h | "
        + " | ".join(f"Muster {n} pods/s | ratio | nodes | $/h" for n in names)
        + " |"
    )
    print("|---:|---|---:|---:|---:|" + "---:|---:|---:|---|" * len(trees))
    worst: dict[str, tuple[float, str]] = {}
    with tempfile.TemporaryDirectory(prefix="muster-karpenter-") as tmp:
        for pods in sizes:
            for mix in mixes:
                for ratio, case in run_case(binary, trees, pods, mix, tmp, args):
                    tree = case.split(",", 1)[0]
                    if tree not in worst or ratio < worst[tree][0]:
                        worst[tree] = (ratio, case)
    if not worst:
        print("karpenter_side_by_side worst_ratio=none")
        return 1
    # One line per tree, the last --muster tree (the one being judged) last.
    for name in names:
        if name in worst:
            ratio, case = worst[name]
            print(f"karpenter_side_by_side worst_ratio={ratio:.2f} case={case}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
