"""Kubernetes Events (core/v1), posted in the background like client-go's event broadcaster.

Reconcilers call :meth:`EventRecorder.event`, which never awaits: the event goes into a
bounded queue that one sender task drains. A slow or failing API server therefore delays or
loses events, never a reconcile; when the queue is full the event is dropped with a debug log
and counted (:attr:`EventBroadcaster.dropped`), as client-go's broadcaster does.

Repeats of the same event (same object, type, reason, message and source) are aggregated as
client-go's ``EventCorrelator`` does: the first is created, later ones PATCH ``count`` and
``lastTimestamp`` of the Event already stored, so a retry loop does not flood ``kubectl
describe``. Only the last ``cache_size`` distinct events are remembered for that, and none
longer than ``aggregate_seconds`` after its last repeat: a repeat after that starts a new
Event. Most of Muster's events are about one request each and never repeat once it is
deleted, so a cache bounded by count alone fills with the dead (up to 4096 entries) and a
long-running controller's memory grows for hours before it levels off; bounded by time too,
it holds about ``aggregate_seconds`` of events.

One :class:`EventBroadcaster` per controller; each component takes its own
:class:`EventRecorder` (its ``source.component`` and ``reportingComponent``) from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from controller.kube.client import ApiError, KubeClient
from controller.kube.resources import EVENTS

log = logging.getLogger(__name__)

EventType = Literal["Normal", "Warning"]

MAX_MESSAGE = 1024
"""The API server refuses longer event messages (events.k8s.io caps ``note`` at 1 kB)."""
MAX_REASON = 128

DEFAULT_QUEUE_SIZE = 1000
"""client-go's broadcaster buffers 1000 events per watcher before dropping."""
DEFAULT_CACHE_SIZE = 4096
"""client-go's correlator remembers 4096 events for aggregation."""
DEFAULT_AGGREGATE_SECONDS = 600.0
"""client-go's aggregator folds similar events within 10 minutes."""


@dataclass(frozen=True, slots=True)
class ObjectReference:
    """The ``involvedObject`` of an Event."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> ObjectReference:
        """The reference to a stored object (its uid and resourceVersion included)."""
        meta = body.get("metadata") or {}
        if not body.get("kind") or not meta.get("name"):
            raise ValueError("an event needs an object with kind and metadata.name")
        return cls(
            api_version=str(body.get("apiVersion") or "v1"),
            kind=str(body["kind"]),
            name=str(meta["name"]),
            namespace=meta.get("namespace"),
            uid=meta.get("uid"),
            resource_version=(
                None if meta.get("resourceVersion") is None else str(meta["resourceVersion"])
            ),
        )

    def to_dict(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        if self.resource_version:
            out["resourceVersion"] = self.resource_version
        return out


@dataclass(frozen=True, slots=True)
class _Event:
    ref: ObjectReference
    type: EventType
    reason: str
    message: str
    component: str
    at: datetime

    @property
    def namespace(self) -> str:
        # Events about cluster-scoped objects live in "default", as kubectl looks for them.
        return self.ref.namespace or "default"

    @property
    def key(self) -> tuple[str, ...]:
        """What makes two events "the same" for aggregation (client-go's aggregate key
        plus the message). The resourceVersion is left out: it changes with every write."""
        r = self.ref
        return (self.namespace, r.kind, r.name, r.uid or "", self.type, self.reason,
                self.message, self.component)


@dataclass(slots=True)
class _Seen:
    name: str
    count: int
    last: datetime
    """When it was last posted or aggregated (the events' own time)."""


class EventBroadcaster:
    """The bounded queue, the sender task and the aggregation cache."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        now: Callable[[], datetime],
        queue_size: int = DEFAULT_QUEUE_SIZE,
        cache_size: int = DEFAULT_CACHE_SIZE,
        aggregate_seconds: float = DEFAULT_AGGREGATE_SECONDS,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size}")
        self.kube = kube
        self.now = now
        self.cache_size = cache_size
        self.aggregate_window = timedelta(seconds=aggregate_seconds)
        self._queue: asyncio.Queue[_Event] = asyncio.Queue(maxsize=queue_size)
        self._seen: OrderedDict[tuple[str, ...], _Seen] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self.created = 0
        """Events created in the API."""
        self.aggregated = 0
        """Repeats folded into an existing Event (its count PATCHed)."""
        self.dropped = 0
        """Events dropped because the queue was full."""
        self.failed = 0
        """Events the API server refused or could not be reached for."""

    def recorder(self, component: str) -> EventRecorder:
        return EventRecorder(self, component)

    @property
    def remembered(self) -> int:
        """Distinct events remembered for aggregation."""
        return len(self._seen)

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="event-sender")

    async def stop(self, *, drain_seconds: float = 1.0) -> None:
        """Send what is queued, for at most ``drain_seconds``, then stop the sender."""
        task, self._task = self._task, None
        if task is None:
            return
        if not task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), timeout=drain_seconds)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self._queue.qsize():
            log.debug("%d event(s) not sent before stopping", self._queue.qsize())

    async def flush(self) -> None:
        """Wait until every queued event has been sent (or has failed)."""
        await self._queue.join()

    def submit(self, event: _Event) -> bool:
        """Queue ``event`` without waiting; False when the queue is full and it was dropped."""
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            log.debug("event queue full (%d): dropped %s %s on %s %s/%s", self._queue.maxsize,
                      event.type, event.reason, event.ref.kind, event.namespace, event.ref.name)
            return False
        return True

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await self._send(event)
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                self.failed += 1
                log.debug("event %s on %s %s/%s not posted: %s", event.reason, event.ref.kind,
                          event.namespace, event.ref.name, exc)
            except Exception:
                # A bug in one event must not stop the sender (and so every later event).
                self.failed += 1
                log.exception("posting event %s on %s/%s failed", event.reason,
                              event.namespace, event.ref.name)
            finally:
                self._queue.task_done()

    async def _send(self, event: _Event) -> None:
        ts = event.at.strftime("%Y-%m-%dT%H:%M:%SZ")
        self._forget_before(event.at - self.aggregate_window)
        seen = self._seen.get(event.key)
        if seen is not None:
            self._seen.move_to_end(event.key)
            try:
                await self.kube.merge_patch(
                    EVENTS, seen.name,
                    # Only these: the API server keeps involvedObject, reason, type and
                    # source of a stored Event immutable.
                    {"count": seen.count + 1, "lastTimestamp": ts},
                    namespace=event.namespace,
                )
            except ApiError as exc:
                if not exc.not_found:  # expired (events have a TTL) or deleted: create anew
                    raise
                del self._seen[event.key]
            else:
                seen.count += 1
                seen.last = event.at
                self.aggregated += 1
                return
        created = await self.kube.create(EVENTS, _body(event, ts), namespace=event.namespace)
        self.created += 1
        name = (created.get("metadata") or {}).get("name")
        if name:
            self._seen[event.key] = _Seen(str(name), int(created.get("count") or 1), event.at)
            while len(self._seen) > self.cache_size:
                self._seen.popitem(last=False)

    def _forget_before(self, cutoff: datetime) -> None:
        # Least recently posted first (a hit moves its entry to the end), so the stale ones
        # are a prefix.
        while self._seen:
            key, oldest = next(iter(self._seen.items()))
            if oldest.last >= cutoff:
                return
            del self._seen[key]


class EventRecorder:
    """Posts Events as one component (``source.component``/``reportingComponent``)."""

    def __init__(self, broadcaster: EventBroadcaster, component: str) -> None:
        self.broadcaster = broadcaster
        self.component = component

    def event(
        self,
        obj: ObjectReference | Mapping[str, Any],
        type_: EventType,
        reason: str,
        message: str,
    ) -> bool:
        """Queue an event about ``obj`` (a reference or the object's body); never waits.
        False when it was dropped (queue full)."""
        if type_ not in ("Normal", "Warning"):
            raise ValueError(f"event type must be Normal or Warning, got {type_!r}")
        if not reason:
            raise ValueError("an event needs a reason")
        ref = obj if isinstance(obj, ObjectReference) else ObjectReference.of(obj)
        return self.broadcaster.submit(_Event(
            ref=ref, type=type_, reason=reason[:MAX_REASON], message=message[:MAX_MESSAGE],
            component=self.component, at=self.broadcaster.now(),
        ))


def _body(event: _Event, ts: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        # generateName: the server picks a unique name (client-go derives one from the wall
        # clock, which the injected test clock would make collide).
        "metadata": {"generateName": f"{event.ref.name[:200]}.", "namespace": event.namespace},
        "involvedObject": event.ref.to_dict(),
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "count": 1,
        "firstTimestamp": ts,
        "lastTimestamp": ts,
        "source": {"component": event.component},
        "reportingComponent": event.component,
    }
