"""Run the sandbox in a background thread with its own event loop, for callers that are not
async or that run their own loop (an e2e fixture, a script).

The store is single-threaded: touch it only through :meth:`ThreadedSandbox.call`, which runs
the function on the sandbox's loop and returns its result.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from sandbox.scheduler import SandboxScheduler
from sandbox.server import SandboxServer
from sandbox.store import Store

T = TypeVar("T")


class ThreadedSandbox:
    """``with ThreadedSandbox(crd_dir="crds", scheduler=True) as sb: sb.url ...``"""

    def __init__(
        self,
        *,
        port: int = 0,
        crd_dir: str | Path | None = None,
        scheduler: bool = False,
        seed: int | None = None,
        store: Store | None = None,
    ) -> None:
        self._args: dict[str, Any] = {"port": port, "crd_dir": crd_dir, "seed": seed,
                                      "store": store}
        self._with_scheduler = scheduler
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sandbox",
                                        daemon=True)
        self.server: SandboxServer | None = None
        self.scheduler: SandboxScheduler | None = None

    def start(self, timeout: float = 10.0) -> ThreadedSandbox:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout)
        return self

    async def _start(self) -> None:
        self.server = SandboxServer(**self._args)
        await self.server.start()
        if self._with_scheduler:
            self.scheduler = SandboxScheduler(self.server.store)
            await self.scheduler.start()

    def stop(self, timeout: float = 10.0) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._loop.close()

    async def _stop(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.stop()
        if self.server is not None:
            await self.server.stop()

    def _server(self) -> SandboxServer:
        if self.server is None:
            raise RuntimeError("the sandbox is not started")
        return self.server

    @property
    def url(self) -> str:
        return self._server().url

    def write_kubeconfig(self, path: str | Path) -> Path:
        return self._server().write_kubeconfig(path)

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 30.0, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the sandbox loop (e.g. ``sb.call(sb.store.create,
        "nodes", body)``) and return its result; exceptions propagate."""

        async def run() -> T:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    @property
    def store(self) -> Store:
        """The store, for use inside :meth:`call` only."""
        return self._server().store

    def __enter__(self) -> ThreadedSandbox:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
