"""Memory of Muster's cluster cache at scale, without a cluster.

    python3 -m benchmarks.memory --nodes 10000 --pods 100000

Feeds a :class:`ClusterState` the nodes and bound pods of ``benchmarks/scale.py`` in the
JSON shape kube-apiserver serves them (its defaults, managedFields, a service-account
volume; about 1.3 KB per node and 2.3 KB per pod, as measured on the real control plane),
in two ways, each in a fresh process:

* ``paged``: pages of :data:`controller.kube.client.LIST_PAGE_SIZE` objects, each decoded
  from its own JSON body and fed through the cache's :class:`Relist` (what the watches do);
* ``whole``: each kind as one JSON body decoded at once, then replaced (what one
  unpaginated LIST per kind did before).

Printed per way: the process's resident memory (VmRSS) before, after the nodes and at the
end, its peak (VmHWM), and the cache's own size measured by tracemalloc on a tenth of the
objects, per node and per pod; then one line ``memory nodes=N pods=P paged_rss_mb=R
paged_peak_mb=H whole_rss_mb=R whole_peak_mb=H``. The interpreter with the controller's
modules imported is in every figure (``base``).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

import controller.operator  # noqa: F401  (the modules `muster run` holds, in the base)
from controller.common.topology_defaults import DEFAULT_LEVELS
from controller.kube.client import LIST_PAGE_SIZE
from controller.state.cache import ClusterState

RUN = "abcde"
NS = f"scale-{RUN}"
STAMP = "2026-12-01T03:04:16Z"
GPU = "nvidia.com/gpu"
Body = dict[str, Any]


def _fields(names: list[str]) -> Body:
    return {f"f:{n}": {} for n in names}


def node(i: int) -> Body:
    """A node of ``benchmarks/scale.py`` as the API server serves it."""
    rack = i // 16
    block = rack // 8
    name = f"scale-{RUN}-{i}"
    amounts = {"cpu": "96", "memory": "1Ti", GPU: "8", "pods": "110"}
    labels = {"kubernetes.io/hostname": name, "scale.muster.dev/run": RUN,
              "topology.muster.dev/block": f"s{block}",
              "topology.muster.dev/rack": f"s{block}-r{rack}"}
    return {
        "metadata": {
            "name": name, "uid": str(uuid.uuid4()), "resourceVersion": str(300 + i),
            "creationTimestamp": STAMP, "labels": labels,
            "managedFields": [{
                "manager": "muster", "operation": "Update", "apiVersion": "v1", "time": STAMP,
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, **_fields(list(labels))}},
                             "f:spec": {"f:taints": {}}}}],
        },
        "spec": {"taints": [{"key": GPU, "value": "present", "effect": "NoSchedule"},
                            {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
        "status": {
            "capacity": dict(amounts), "allocatable": dict(amounts),
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": None,
                            "lastTransitionTime": None, "reason": "KubeletReady"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {k: "" for k in (
                "machineID", "systemUUID", "bootID", "kernelVersion", "osImage",
                "containerRuntimeVersion", "kubeletVersion", "kubeProxyVersion",
                "operatingSystem", "architecture")},
        },
    }


def pod(i: int, nodes: int) -> Body:
    """A bound pod of ``benchmarks/scale.py`` as the API server serves it."""
    requests = {"cpu": "100m", "memory": "128Mi"}
    limits: dict[str, str] = {}
    if i % 8 == 0:
        requests[GPU] = limits[GPU] = "1"
    volume = f"kube-api-access-{uuid.uuid4().hex[:5]}"
    container_fields = _fields(["image", "imagePullPolicy", "name", "terminationMessagePath",
                                "terminationMessagePolicy"])
    return {
        "metadata": {
            "name": f"p{i}", "namespace": NS, "uid": str(uuid.uuid4()),
            "resourceVersion": str(10_000 + i), "generation": 1, "creationTimestamp": STAMP,
            "labels": {"scale.muster.dev/run": RUN},
            "managedFields": [{
                "manager": "muster", "operation": "Update", "apiVersion": "v1", "time": STAMP,
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {"f:labels": {".": {}, "f:scale.muster.dev/run": {}}},
                    "f:spec": {
                        "f:containers": {'k:{"name":"c"}': {
                            ".": {}, **container_fields,
                            "f:resources": {".": {}, "f:limits": _fields(list(limits)),
                                            "f:requests": _fields(list(requests))}}},
                        **_fields(["dnsPolicy", "enableServiceLinks", "nodeName",
                                   "restartPolicy", "schedulerName", "securityContext",
                                   "terminationGracePeriodSeconds", "tolerations"])}}}],
        },
        "spec": {
            "volumes": [{"name": volume, "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt",
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}],
                "defaultMode": 420}}],
            "containers": [{
                "name": "c", "image": "none",
                "resources": {"limits": limits, "requests": requests},
                "volumeMounts": [{"name": volume, "readOnly": True,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File", "imagePullPolicy": "Always"}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
            "serviceAccount": "default", "nodeName": f"scale-{RUN}-{i % nodes}",
            "securityContext": {}, "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": GPU, "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def _pages(make: Any, count: int) -> Iterator[bytes]:
    """JSON list bodies of LIST_PAGE_SIZE objects (made lazily: only one page exists)."""
    for start in range(0, count, LIST_PAGE_SIZE):
        yield orjson.dumps({"items": [make(i) for i in range(start, min(count,
                                                                        start + LIST_PAGE_SIZE))]})


def _status() -> dict[str, float]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(line.split()[1]) / 1024.0
    return out


def _feed(state: ClusterState, kind: str, bodies: Iterator[bytes]) -> None:
    relist = state.relists[kind]
    body = next(bodies, None)
    first = True
    while body is not None:
        items = orjson.loads(body)["items"]
        body = next(bodies, None)
        relist.page(items, first=first, last=body is None)
        first = False
        del items


def measure(way: str, nodes: int, pods: int) -> dict[str, float]:
    """One way's figures, in this process."""
    gc.collect()
    base = _status()["VmRSS"]
    state = ClusterState(levels=DEFAULT_LEVELS)
    if way == "paged":
        _feed(state, "nodes", _pages(node, nodes))
        after_nodes = _status()["VmRSS"]
        _feed(state, "pods", _pages(lambda i: pod(i, nodes), pods))
    else:
        # One body per kind, as an unpaginated LIST answers (joined from pages: only the
        # body, never its objects, exists at once before it is decoded).
        body = b'{"items":[' + b",".join(p[10:-2] for p in _pages(node, nodes)) + b"]}"
        state.replace_nodes(orjson.loads(body)["items"])
        del body
        after_nodes = _status()["VmRSS"]
        body = b'{"items":[' + b",".join(
            p[10:-2] for p in _pages(lambda i: pod(i, nodes), pods)) + b"]}"
        items = orjson.loads(body)["items"]
        del body
        state.replace_pods(items)
        del items
    gc.collect()
    end = _status()
    objects = state.objects
    assert len(objects.nodes()) == nodes and objects.pods_on(f"scale-{RUN}-0") == -(-pods // nodes)
    return {"base": base, "nodes": after_nodes, "rss": end["VmRSS"], "peak": end["VmHWM"]}


def per_object(nodes: int, pods: int) -> dict[str, float]:
    """Bytes the cache keeps per node and per pod (tracemalloc, a tenth of the objects)."""
    nodes, pods = max(1, nodes // 10), max(1, pods // 10)
    state = ClusterState(levels=DEFAULT_LEVELS)
    gc.collect()
    tracemalloc.start()
    _feed(state, "nodes", _pages(node, nodes))
    gc.collect()
    after_nodes = tracemalloc.get_traced_memory()[0]
    _feed(state, "pods", _pages(lambda i: pod(i, nodes), pods))
    gc.collect()
    after_pods = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"node_bytes": after_nodes / nodes, "pod_bytes": (after_pods - after_nodes) / pods}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.memory",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--way", choices=["paged", "whole", "per-object"],
                        help="measure one way in this process (the driver runs each in its own)")
    args = parser.parse_args(argv)
    if args.way == "per-object":
        print(json.dumps(per_object(args.nodes, args.pods)))
        return 0
    if args.way:
        print(json.dumps(measure(args.way, args.nodes, args.pods)))
        return 0
    print(f"node JSON {len(orjson.dumps(node(1)))} B, pod JSON {len(orjson.dumps(pod(1, 1)))} B "
          f"(as kube-apiserver serves benchmarks/scale.py's objects)")
    figures: dict[str, dict[str, float]] = {}
    for way in ("paged", "whole", "per-object"):
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.memory", "--nodes", str(args.nodes),
             "--pods", str(args.pods), "--way", way],
            capture_output=True, text=True, check=True)
        figures[way] = json.loads(done.stdout)
    for way in ("paged", "whole"):
        f = figures[way]
        print(f"{way}: RSS {f['base']:.0f} MB base, {f['nodes']:.0f} MB with {args.nodes} nodes,"
              f" {f['rss']:.0f} MB with {args.pods} pods; peak {f['peak']:.0f} MB")
    o = figures["per-object"]
    print(f"cache: {o['node_bytes'] / 1024:.1f} KB per node, {o['pod_bytes']:.0f} B per pod "
          "(tracemalloc)")
    p, w = figures["paged"], figures["whole"]
    print(f"memory nodes={args.nodes} pods={args.pods} paged_rss_mb={p['rss']:.0f} "
          f"paged_peak_mb={p['peak']:.0f} whole_rss_mb={w['rss']:.0f} "
          f"whole_peak_mb={w['peak']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
