"""A fault-injecting proxy in front of the real kube-apiserver, for Muster's client only.

Muster talks plain HTTP to ``127.0.0.1:<port>`` (its kubeconfig from :meth:`kubeconfig`,
with its ServiceAccount token); the proxy forwards each request over TLS to the API server
unchanged, unless a switch says otherwise:

* ``error_rate``: that share of requests is answered 500 or 503 (a Status body, no
  Retry-After: the client must not be told to wait, it must cope);
* ``conflict_rate``: that share of writes (POST, PUT, PATCH, DELETE) is answered 409;
* ``drop_watches_after``: every watch stream is cut (the connection closed mid-stream, no
  clean end) this many seconds after it started, streams open when it is set included.

Draws come from one seeded ``random.Random``; :attr:`injected` counts faults by kind. The
switches can change at any time (a storm starts and stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
from collections import Counter
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from e2e import cluster as cp

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection",
                         "keep-alive", "accept-encoding"})


def _status(code: int, reason: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f"injected by e2e.faultproxy: {reason}", "reason": reason, "code": code}
    return web.json_response(body, status=code)


class FaultProxy:
    def __init__(self, cluster: cp.Cluster, port: int, *, seed: int = 1) -> None:
        self.cluster = cluster
        self.port = port
        self.rng = random.Random(seed)
        self.error_rate = 0.0
        self.conflict_rate = 0.0
        self.drop_watches_after: float | None = None
        self.injected: Counter[str] = Counter()
        self.forwarded = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def calm(self) -> None:
        self.error_rate = self.conflict_rate = 0.0
        self.drop_watches_after = None

    def kubeconfig(self, path: Path) -> Path:
        """Muster's kubeconfig, pointed at this proxy."""
        muster = yaml.safe_load(self.cluster.muster_kubeconfig.read_text())
        muster["clusters"][0]["cluster"] = {"server": f"http://127.0.0.1:{self.port}"}
        path.write_text(yaml.safe_dump(muster))
        path.chmod(0o600)
        return path

    async def start(self) -> None:
        ctx = ssl.create_default_context(cafile=str(self.cluster.state / "pki" / "ca.crt"))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False)
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") in ("true", "1")
        if self.error_rate and self.rng.random() < self.error_rate:
            code = self.rng.choice((500, 503))
            self.injected[str(code)] += 1
            return _status(code, "InternalError" if code == 500 else "ServiceUnavailable")
        if (request.method in WRITES and self.conflict_rate
                and self.rng.random() < self.conflict_rate):
            self.injected["409"] += 1
            return _status(409, "Conflict")
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        body = await request.read() if request.can_read_body else None
        url = f"{self.cluster.server}{request.rel_url}"
        self.forwarded += 1
        try:
            upstream = await self._session.request(request.method, url, headers=headers,
                                                   data=body)
        except (aiohttp.ClientError, OSError):
            self.injected["upstream-down"] += 1
            return _status(503, "ServiceUnavailable")
        async with upstream:
            out = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
            await out.prepare(request)
            if not watch:
                await out.write(await upstream.read())
                await out.write_eof()
                return out
            return await self._stream(request, upstream, out)

    async def _stream(self, request: web.Request, upstream: aiohttp.ClientResponse,
                      out: web.StreamResponse) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with contextlib.suppress(aiohttp.ClientError, ConnectionError, TimeoutError):
            while True:
                # Read at each turn: a storm started after the stream was opened cuts it too
                # (Muster's watch streams last minutes; those opened before the switch would
                # otherwise never be cut).
                drop = self.drop_watches_after
                if drop is not None and loop.time() - started >= drop:
                    # Cut, not ended: the client sees a broken stream.
                    self.injected["watch-dropped"] += 1
                    if request.transport is not None:
                        request.transport.close()
                    return out
                wait = 1.0 if drop is None else max(0.0, min(1.0, started + drop - loop.time()))
                try:
                    chunk = await asyncio.wait_for(upstream.content.readany(), wait)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                await out.write(chunk)
            await out.write_eof()
        return out


def describe(proxy: FaultProxy) -> str:
    return json.dumps({"injected": dict(proxy.injected), "forwarded": proxy.forwarded},
                      sort_keys=True)

