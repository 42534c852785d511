"""Watch plumbing: events serialised once and shared by every watcher, and per-watcher bounded
queues so that a slow consumer is cut off instead of slowing the server down."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]


class WatchEvent:
    """One change of one object; ``old`` is the previous state of a MODIFIED object."""

    __slots__ = ("_lines", "obj", "old", "rv", "type")

    def __init__(self, type_: str, obj: Obj, rv: int, old: Obj | None = None) -> None:
        self.type = type_
        self.obj = obj
        self.old = old
        self.rv = rv
        self._lines: dict[tuple[str, str | None], bytes] = {}

    def line(self, type_: str, api_version: str | None = None) -> bytes:
        """The JSON line of this event, built once per (type, apiVersion) and then shared."""
        key = (type_, api_version)
        cached = self._lines.get(key)
        if cached is None:
            obj = self.obj
            if api_version is not None and obj.get("apiVersion") != api_version:
                obj = {**obj, "apiVersion": api_version}
            cached = json.dumps({"type": type_, "object": obj}, separators=(",", ":")).encode()
            cached += b"\n"
            self._lines[key] = cached
        return cached


class Watcher:
    """One open watch: filters events of its table and queues what its client should see.

    ``offer`` is called synchronously by the store for every event; it never blocks. When more
    than ``max_queue`` events wait, the watcher is closed (its client gets the stream ended and
    re-lists, like after a real apiserver drops a slow watcher).
    """

    __slots__ = (
        "api_version", "close_reason", "closed", "delivered", "match", "max_queue", "namespace",
        "on_close", "queue", "resource", "since", "wakeup",
    )

    def __init__(
        self,
        resource: tuple[str, str],
        namespace: str | None,
        match: Callable[[Obj], bool] | None,
        max_queue: int,
        api_version: str | None = None,
    ) -> None:
        self.resource = resource
        self.namespace = namespace
        self.match = match
        self.max_queue = max_queue
        self.api_version = api_version
        self.queue: deque[tuple[str, WatchEvent]] = deque()
        self.wakeup = asyncio.Event()
        self.closed = False
        self.close_reason = ""
        self.delivered = 0
        self.on_close: Callable[[Watcher], None] | None = None
        self.since = 0
        """The resourceVersion the watch started from: like the apiserver's watch cache
        (``cacheWatcher.process``), only events and bookmarks newer than it are sent, so a
        watch from a resourceVersion the store has not reached hears nothing until it does."""

    def _in_scope(self, obj: Obj) -> bool:
        if self.namespace is None:
            return True
        return (obj.get("metadata") or {}).get("namespace") == self.namespace

    def offer(self, ev: WatchEvent) -> None:
        if self.closed or ev.rv <= self.since:
            return
        if not self._in_scope(ev.obj):
            return
        type_ = ev.type
        if self.match is not None:
            now = self.match(ev.obj)
            if type_ == "MODIFIED" and ev.old is not None:
                before = self.match(ev.old)
                # An object entering or leaving the selection looks added or deleted to the
                # watcher, as on a real apiserver.
                if now and not before:
                    type_ = "ADDED"
                elif before and not now:
                    type_ = "DELETED"
                elif not now:
                    return
            elif not now:
                return
        self.push(type_, ev)

    def push(self, type_: str, ev: WatchEvent) -> None:
        if self.closed:
            return
        if len(self.queue) >= self.max_queue:
            self.close("watcher too slow: event queue overflow")
            return
        self.queue.append((type_, ev))
        self.wakeup.set()

    def close(self, reason: str = "closed") -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        self.wakeup.set()
        if self.on_close is not None:
            self.on_close(self)

    async def next_batch(self, max_wait: float | None) -> list[tuple[str, WatchEvent]]:
        """Queued events (possibly empty on timeout); empty and ``closed`` once closed."""
        if not self.queue and not self.closed:
            self.wakeup.clear()
            try:
                await asyncio.wait_for(self.wakeup.wait(), max_wait)
            except TimeoutError:
                return []
        batch = list(self.queue)
        self.queue.clear()
        self.delivered += len(batch)
        return batch

    async def events(self) -> Any:
        """Async iterator of ``(type, object)`` for in-process consumers (the scheduler)."""
        while True:
            batch = await self.next_batch(None)
            for type_, ev in batch:
                yield type_, ev.obj
            if self.closed and not self.queue:
                return
