"""Muster's API client (:class:`controller.kube.KubeClient`) against kubernetes-asyncio's
generated API (``CoreV1Api`` through ``ApiClient.call_api``), on the same connections.

Both sides share one ``ApiClient`` (the kubeconfig, TLS, token refresh and aiohttp session
KubeClient uses), so what differs is only the layer above the session: Muster sends the
request itself and parses the body with orjson into dicts; the library walks its parameters,
builds the request and, by default, turns the answer into model objects (``V1Node``). The
library is measured both ways: as documented (models) and with ``_preload_content=False``
(its raw response, parsed here with orjson, as Muster would have to for dicts).

What runs, on ``--nodes`` Nodes the run creates (labelled with the run, removed at the end):

* **list**: LIST of all of them (label selector), ``--rounds`` times;
* **get**: ``--gets`` GETs of one node each, 32 at a time (the controller's reads and writes
  are many small requests);
* **watch**: a watch from "now" (no resourceVersion: the server sends every node as ADDED
  first), read until all of them arrived: KubeClient's stream against
  ``kubernetes_asyncio.watch.Watch`` over ``list_node``.

Each figure is this process's CPU time (``time.process_time``) per operation, the median of
``--rounds`` rounds with the variants interleaved; the API server (a sandbox in its own
process, or ``--kubeconfig``'s cluster) is not counted. Last line:
``kube_client_bench nodes=<n> list_ratio=<x> get_ratio=<y> watch_ratio=<z>`` (library with
models / Muster's client, CPU per operation).

    python3 -m benchmarks.kube_client_bench [--nodes 1000] [--gets 2000] [--rounds 5]
        [--kubeconfig PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import watch as k8s_watch

from benchmarks.controller_bench import sandbox
from benchmarks.target import RUN_LABEL, Target, add_target_arguments, target
from controller.commands import objects
from controller.kube import KubeClient, WatchEvent
from controller.kube.resources import NODES

CONCURRENCY = 32
SANDBOX_DEFAULT_NODES = 1000


class _Enough(Exception):
    """All the nodes arrived: end the watch."""


async def _cpu(action: Callable[[], Awaitable[Any]]) -> float:
    gc.collect()  # the garbage of the variant before is not this one's to collect
    started = time.process_time()
    await action()
    return time.process_time() - started


async def _each(names: list[str], act: Callable[[str], Awaitable[Any]]) -> None:
    queue = list(names)

    async def worker() -> None:
        while queue:
            await act(queue.pop())

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


def _api_client(kube: KubeClient) -> k8s.ApiClient:
    # The same ApiClient (and so the same aiohttp session and connections) as KubeClient's:
    # the comparison is of the layers above it only.
    api: k8s.ApiClient = kube._api
    return api


async def seed(t: Target, count: int) -> list[str]:
    names = [t.name(f"bench-node-{i}") for i in range(count)]
    labels = {**t.selector, objects.BLOCK: "b1", objects.RACK: "b1-r1",
              "muster.dev/accelerator": "h100"}
    await _each(names, lambda n: t.kube.create(NODES, objects.node(
        n, allocatable={"cpu": "96", "memory": "1024Gi", objects.GPU: "8"}, labels=labels,
        taints=[objects.GPU_TAINT])))
    return names


class Variants:
    """Each way to do each operation on the run's nodes."""

    def __init__(self, t: Target, names: list[str], gets: int) -> None:
        self.kube = t.kube
        self.core = k8s.CoreV1Api(_api_client(t.kube))
        self.selector = f"{RUN_LABEL}={t.run}"
        self.n = len(names)
        # One request per LIST on both sides: the request paths are compared, not paging
        # (Muster's watches list in pages of 500 to bound memory; benchmarks/memory.py).
        self.kube.page_size = max(self.n, 1)
        self.picks = [names[i % self.n] for i in range(gets)]

    def all(self) -> dict[str, Callable[[], Awaitable[None]]]:
        return {
            "list muster": self.list_muster, "list library models": self.list_models,
            "list library raw": self.list_raw,
            "get muster": self.get_muster, "get library models": self.get_models,
            "get library raw": self.get_raw,
            "watch muster": self.watch_muster,
            "watch library models": lambda: self.watch_library(None),
            "watch library dicts": lambda: self.watch_library("object"),
        }

    async def list_muster(self) -> None:
        got = await self.kube.list(NODES, label_selector=self.selector)
        assert len(got["items"]) == self.n

    async def list_models(self) -> None:
        got = await self.core.list_node(label_selector=self.selector)
        assert len(got.items) == self.n

    async def list_raw(self) -> None:
        resp: Any = await self.core.list_node(label_selector=self.selector,
                                              _preload_content=False)
        got = orjson.loads(await resp.read())
        assert len(got["items"]) == self.n

    async def get_muster(self) -> None:
        await _each(self.picks, lambda name: self.kube.get(NODES, name))

    async def get_models(self) -> None:
        await _each(self.picks, self.core.read_node)

    async def get_raw(self) -> None:
        async def one(name: str) -> None:
            resp: Any = await self.core.read_node(name, _preload_content=False)
            orjson.loads(await resp.read())
        await _each(self.picks, one)

    async def watch_muster(self) -> None:
        seen = 0

        def on_event(ev: WatchEvent) -> None:
            nonlocal seen
            seen += 1
            if seen == self.n:
                raise _Enough

        with contextlib.suppress(_Enough):
            await self.kube._watch_once(NODES, "", on_event, None, self.selector, 60)
        assert seen == self.n

    async def watch_library(self, return_type: str | None) -> None:
        seen = 0
        async with k8s_watch.Watch(return_type=return_type) as w:
            async for ev in w.stream(self.core.list_node, label_selector=self.selector,
                                     timeout_seconds=60):
                if ev["type"] == "BOOKMARK":
                    continue
                seen += 1
                if seen == self.n:
                    break
        assert seen == self.n


async def measure(t: Target, names: list[str], *, gets: int, rounds: int) -> dict[str, float]:
    variants = Variants(t, names, gets).all()
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for action in variants.values():  # warm-up: connections, imports, caches
        await action()
    for _ in range(rounds):
        for name, action in variants.items():
            samples[name].append(await _cpu(action))
    return {k: statistics.median(v) for k, v in samples.items()}


def report(cpu: dict[str, float], *, nodes: int, gets: int) -> None:
    per = {"list": (1, "per LIST"), "get": (gets, "per GET"), "watch": (nodes, "per event")}
    for op, (count, unit) in per.items():
        base = cpu[f"{op} muster"] / count
        print(f"{op} ({unit}, client CPU):")
        for name in (f"{op} muster", f"{op} library models",
                     f"{op} library raw" if op != "watch" else "watch library dicts"):
            value = cpu[name] / count
            print(f"  {name:<22} {value * 1e6:10.1f} us  x{value / base:5.2f}")
    ratio = {op: cpu[f"{op} library models"] / cpu[f"{op} muster"] for op in per}
    print(f"kube_client_bench nodes={nodes} list_ratio={ratio['list']:.2f} "
          f"get_ratio={ratio['get']:.2f} watch_ratio={ratio['watch']:.2f}")


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=SANDBOX_DEFAULT_NODES)
    parser.add_argument("--gets", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    add_target_arguments(parser, "")
    args = parser.parse_args(argv)
    async with target(args, lambda: sandbox(False)) as t:
        names: list[str] = []
        try:
            names = await seed(t, args.nodes)
            cpu = await measure(t, names, gets=args.gets, rounds=args.rounds)
        finally:
            await _each(names, lambda n: t.kube.delete(NODES, n))
            print(await t.cleanup(()))
    where = "real cluster" if t.real else "sandbox: subprocess"
    print(f"kube_client_bench: {args.nodes} nodes, {args.gets} GETs, {args.rounds} rounds "
          f"({where})")
    report(cpu, nodes=args.nodes, gets=args.gets)


if __name__ == "__main__":
    asyncio.run(main())
