"""The one place Muster talks to the Kubernetes API server.

kubernetes-asyncio loads the kubeconfig (or the in-cluster service account) and its API
client sends every request (``ApiClient.call_api``: TLS, auth and exec plugins' token
refresh, proxies); Muster reads the raw answer (``_preload_content=False``) as plain JSON
dicts with orjson. The library's model objects are skipped on purpose: per operation they
cost several times the client's CPU, most of all on a LIST (docs/benchmarks/kube-client.md),
and its custom-object helpers would send dict
patches as JSON-patch (a real server rejects those). Watches are Muster's own list-then-watch
(:meth:`KubeClient.watch`) over the same client, not ``kubernetes_asyncio.watch.Watch``,
which never re-lists, retries an expired resourceVersion once with the same expired
resourceVersion, and resumes forever from a resourceVersion a server that came back with
another etcd never had (tests/kube/test_watch_library.py; docs/design/api-client.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from controller import __version__
from controller.common.problem_log import ProblemLog
from controller.kube.resources import Resource

log = logging.getLogger(__name__)
_problems = ProblemLog(log)

WATCH_TIMEOUT = 300
"""Seconds a watch request asks the server to keep its stream open (``timeoutSeconds``)."""
MAX_RETRY_DELAY = 8.0
"""A failing watch re-lists after 1 s, doubling up to this: an API server that is down for a
minute costs a few requests per watch, and one that came back is seen within seconds."""


class _HistoryLost(Exception):
    """The server does not have the resourceVersion a watch resumed from (it came back
    empty or restarted): only a fresh list can tell what changed."""


@dataclass(slots=True)
class WatchHealth:
    """What one watch has achieved, for the probes (monotonic seconds)."""

    progress_at: float
    """Last list, event or bookmark received: the watch's view is current as of then."""
    error: str | None = None
    """Why its last request failed, while it fails."""
    failures: int = 0
    """Failures in a row (the backoff)."""
    seen_rv: int | None = None
    """The highest resourceVersion received since the watch's last listing began (an etcd
    revision; None when the server's are not numbers)."""

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

Body = dict[str, Any]
BodyList = list[Body]
"""Alias: inside :class:`KubeClient`, ``list`` names the method."""


class ApiError(Exception):
    """A non-2xx answer from the API server (or no answer at all, status 0)."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}: {body[:500]}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str
    """ADDED | MODIFIED | DELETED (bookmarks are consumed inside :meth:`KubeClient.watch`)."""
    object: Body


LIST_PAGE_SIZE = 500
"""Objects per LIST request. An unpaginated LIST of a large cluster's Pods is one body decoded
into dicts all at once, a peak many times the cache it feeds, and the process keeps much of
that heap afterwards; pages bound the peak to one page (docs/benchmarks/memory.md)."""


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a listing (:meth:`KubeClient.pages`)."""

    items: BodyList
    first: bool
    """The listing starts here, or starts again (its continue token expired): what the
    pages before held may be gone since."""
    last: bool
    """The listing is complete: an object no page since the last ``first`` held is gone."""
    resource_version: str
    """The listing's resourceVersion (a watch resumes from the last page's)."""


def whole_listing(
    on_sync: Callable[[BodyList], Awaitable[None] | None],
) -> Callable[[Page], Awaitable[None] | None]:
    """A page callback for :meth:`KubeClient.watch` that hands ``on_sync`` every item of a
    listing at once, on its last page: for views small enough to replace in one step."""
    items: BodyList = []

    def on_page(page: Page) -> Awaitable[None] | None:
        nonlocal items
        if page.first:
            items = []
        items.extend(page.items)
        if not page.last:
            return None
        done, items = items, []
        return on_sync(done)

    return on_page


MAX_RETRY_AFTER = 10
"""Retries of a request the API server answered with 429 or 5xx and a Retry-After header
(client-go's ``maxRetries`` for the same case)."""


def _retry_after(resp: aiohttp.ClientResponse) -> float | None:
    """Seconds to wait before retrying, when the server asked for a retry; else None."""
    if resp.status != 429 and not 500 <= resp.status <= 599:
        return None
    header = resp.headers.get("Retry-After")
    if header is None:
        return None
    try:
        seconds = float(header)
    except ValueError:
        return None
    return min(max(seconds, 0.05), 10.0)


USER_AGENT = f"muster/{__version__}"
"""How the API server's audit log, its priority-and-fairness metrics and its logs name
Muster's requests (client-go sends ``<binary>/<version>`` the same way)."""


class KubeClient:
    """Async access to one cluster. Create with :meth:`from_kubeconfig` or :meth:`in_cluster`;
    close with :meth:`close` (or ``async with``)."""

    def __init__(self, api_client: k8s_client.ApiClient, *,
                 user_agent: str = USER_AGENT) -> None:
        self._api = api_client
        api_client.user_agent = user_agent
        _no_env_lookups(api_client)
        self._inflight: set[asyncio.Future[aiohttp.ClientResponse]] = set()
        """Requests being sent, including those whose caller was cancelled (shielded)."""
        self.watch_timeout = WATCH_TIMEOUT
        self.page_size = LIST_PAGE_SIZE
        """Objects per LIST request (:meth:`pages`)."""
        self.watches: dict[str, WatchHealth] = {}
        """Running watches by name (resource, namespace, selector)."""
        self.storage_regressed: str | None = None
        """Set when a create answered a resourceVersion below one the watches had already
        received before it was sent (:meth:`_check_write`): the API server's storage went
        back in time (etcd wiped or restored under a running kube-apiserver) while its watch
        cache still serves the old world. Cleared once every watch listed again below that
        resourceVersion (kube-apiserver restarted and serves the new storage)."""
        self._regressed_from: int | None = None

    @classmethod
    async def from_kubeconfig(
        cls, path: Path | None = None, *, context: str | None = None,
        user_agent: str = USER_AGENT,
    ) -> KubeClient:
        cfg = k8s_client.Configuration()
        await k8s_config.load_kube_config(
            config_file=str(path) if path else None,
            context=context,
            client_configuration=cfg,
            persist_config=False,
        )
        return cls(k8s_client.ApiClient(configuration=_pooled(cfg)), user_agent=user_agent)

    @classmethod
    def in_cluster(cls, *, user_agent: str = USER_AGENT) -> KubeClient:
        cfg = k8s_client.Configuration()
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cls(k8s_client.ApiClient(configuration=_pooled(cfg)), user_agent=user_agent)

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    async def drain(self, within: float = 10.0) -> int:
        """Wait (at most ``within`` seconds) for requests still being sent, those of
        cancelled callers included; return how many are still running.

        Before the client closes (the controller's stop): a request is shielded from its
        caller's cancellation (see :meth:`_send`) and still runs after the caller is gone;
        closing the session under it would cut it mid-answer.
        """
        pending = set(self._inflight)
        if not pending:
            return 0
        _, still = await asyncio.wait(pending, timeout=within)
        return len(still)

    async def close(self) -> None:
        await self._api.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ raw request

    async def _request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        request_timeout: float | None = 60.0,
    ) -> Body:
        for attempt in range(MAX_RETRY_AFTER + 1):
            resp = await self._send(method, path, query, body, content_type, request_timeout)
            try:
                data = await resp.read()
            except BaseException:
                # Cancelled or broken mid-body: never hand this connection back to the pool.
                resp.close()
                raise
            resp.release()
            wait = _retry_after(resp)
            if wait is None or attempt == MAX_RETRY_AFTER:
                break
            # The server asked us to come back (a 429 while a new resource's watch cache
            # initialises, API priority and fairness, a 503 with Retry-After): client-go
            # retries these itself, up to 10 times, and so do we.
            await asyncio.sleep(wait)
        if not 200 <= resp.status <= 299:
            raise ApiError(resp.status, str(resp.reason), data.decode(errors="replace"))
        if not data:
            return {}
        parsed: Body = orjson.loads(data)
        return parsed

    async def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str | int] | None,
        body: Any,
        content_type: str,
        request_timeout: float | None,
    ) -> aiohttp.ClientResponse:
        """Send one request; transport failures become ``ApiError`` with status 0.

        Shielded from cancellation: cancelling aiohttp while it waits for response headers
        can leave the connection in the pool with the answer still to come, and the next
        request on it then hangs until its timeout. Shielded, the request completes on its
        own and its response is closed.
        """
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        # The library's API client builds and sends the request (auth, refreshing exec
        # plugins' tokens, proxy, TLS server name); its raw response is read here, since its
        # model objects cost many times the CPU of plain dicts (docs/benchmarks/kube-client.md).
        task = asyncio.ensure_future(self._api.call_api(
            path, method, query_params=list(query.items()) if query else None,
            header_params=headers, body=body, auth_settings=["BearerToken"],
            _preload_content=False, _request_timeout=request_timeout,
        ))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_close_quietly)
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(0, type(exc).__name__, str(exc)) from exc

    async def serves(self, api_version: str) -> bool:
        """Whether the API server serves ``api_version`` (``group/version``, or ``v1``)."""
        path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        try:
            await self._request("GET", path)
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    # ------------------------------------------------------------------ CRUD

    async def get(self, res: Resource, name: str, *, namespace: str | None = None) -> Body:
        return await self._request("GET", res.path(namespace=namespace, name=name))

    async def get_or_none(
        self, res: Resource, name: str, *, namespace: str | None = None
    ) -> Body | None:
        try:
            return await self.get(res, name, namespace=namespace)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def list(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Body:
        """The whole listing (``items`` and ``metadata.resourceVersion``), fetched in pages
        (:meth:`pages`). For small kinds or selections: a watch feeds large ones into its
        cache page by page instead of holding every item at once."""
        items: BodyList = []
        rv = ""
        async for page in self.pages(res, namespace=namespace, label_selector=label_selector,
                                     field_selector=field_selector):
            if page.first:
                items = []
            items.extend(page.items)
            rv = page.resource_version
        return {"metadata": {"resourceVersion": rv}, "items": items}

    async def pages(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int | None = None,
    ) -> AsyncGenerator[Page, None]:
        """List ``res`` in pages of ``page_size`` (default :attr:`page_size`;
        ``limit``/``continue``).

        The API server serves every page of one listing from the same snapshot (the first
        page's resourceVersion). When the snapshot is compacted away before the listing
        ends, the next page's answer is 410 Gone ("continue parameter is too old"): the
        listing starts again from the first page, which says so (:attr:`Page.first`).
        A server that ignores ``limit`` answers with one page, first and last.
        """
        base: dict[str, str | int] = {"limit": page_size or self.page_size}
        if label_selector:
            base["labelSelector"] = label_selector
        if field_selector:
            base["fieldSelector"] = field_selector
        token: str | None = None
        first = True
        while True:
            query = {**base, "continue": token} if token else base
            try:
                body = await self._request("GET", res.path(namespace=namespace), query=query)
            except ApiError as exc:
                if not (exc.gone and token):
                    raise
                _problems.warning(f"continue {res.plural}",
                                  "listing %s: its continue token expired; listing again",
                                  res.plural)
                token, first = None, True
                continue
            meta = body.get("metadata") or {}
            token = meta.get("continue") or None
            yield Page(items=body.get("items") or [], first=first, last=token is None,
                       resource_version=str(meta.get("resourceVersion", "")))
            del body  # the page's items belong to the consumer now
            if token is None:
                return
            first = False

    async def create(self, res: Resource, body: Body, *, namespace: str | None = None) -> Body:
        seen = self.seen_rv()
        created = await self._request("POST", res.path(namespace=namespace), body=body)
        self._check_write(res, created, seen)
        return created

    def seen_rv(self) -> int | None:
        """The highest resourceVersion the running watches have received since their last
        listings began."""
        rvs = [h.seen_rv for h in self.watches.values() if h.seen_rv is not None]
        return max(rvs) if rvs else None

    def _check_write(self, res: Resource, written: Body, seen: int | None) -> None:
        """Notice storage that went back in time under the API server.

        A create writes a new etcd revision, above every revision committed before the
        request was sent, so above ``seen`` (the watches' highest before sending). One below
        it came from an etcd that lost the history the watches saw: etcd was wiped or
        restored while kube-apiserver kept running. Its watch cache then keeps serving the
        old world (lists and watches at the old, larger resourceVersions, its own etcd watch
        waiting for a revision the new etcd has not reached), so re-listing cannot rebuild
        the view: only a kube-apiserver restart can, and /readyz says so meanwhile.

        Only creates: a patch or update that changes nothing answers the object's old
        resourceVersion. Events are left out: they are the resource commonly kept on an
        etcd of its own (``--etcd-servers-overrides``), whose revisions are another count.
        resourceVersions are compared as numbers, as the watch's resume check does (etcd
        revisions on every server Muster meets; anything else is not compared).
        """
        if seen is None or res.plural == "events":
            return
        rv = _int_rv(str((written.get("metadata") or {}).get("resourceVersion", "")))
        if rv is None or rv >= seen:
            return
        if self.storage_regressed is None:
            log.error("the API server's storage went back in time: creating %s answered "
                      "resourceVersion %d, below %d already received by the watches",
                      res.plural, rv, seen)
        self._regressed_from = max(seen, self._regressed_from or 0)
        self.storage_regressed = (
            f"the API server's storage went back in time: creating a {res.kind} answered "
            f"resourceVersion {rv}, below {self._regressed_from} the watches had already "
            "received (etcd was wiped or restored while kube-apiserver kept running, and its "
            "watch cache still serves the old objects); restart kube-apiserver so its cache "
            "is rebuilt from etcd, and Muster re-lists"
        )

    def _relisted(self) -> None:
        """Clear :attr:`storage_regressed` once every watch listed below where the storage
        went back from: the server serves the new storage now."""
        if self._regressed_from is None:
            return
        if all(h.seen_rv is not None and h.seen_rv < self._regressed_from
               for h in self.watches.values()):
            log.warning("every watch re-listed from the API server's new storage")
            self.storage_regressed = self._regressed_from = None

    async def merge_patch(
        self,
        res: Resource,
        name: str,
        patch: Body,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> Body:
        return await self._request(
            "PATCH",
            res.path(namespace=namespace, name=name, subresource=subresource),
            body=patch,
            content_type=MERGE_PATCH,
        )

    async def json_patch(
        self,
        res: Resource,
        name: str,
        ops: BodyList,
        *,
        namespace: str | None = None,
    ) -> Body:
        return await self._request(
            "PATCH", res.path(namespace=namespace, name=name), body=ops, content_type=JSON_PATCH
        )

    async def patch_status(
        self, res: Resource, name: str, status: Body, *, namespace: str | None = None
    ) -> Body:
        """Merge-patch ``status`` through the ``/status`` subresource."""
        return await self.merge_patch(
            res, name, {"status": status}, namespace=namespace, subresource="status"
        )

    async def delete(
        self, res: Resource, name: str, *, namespace: str | None = None
    ) -> bool:
        """Delete; return False when it was already gone (404 is not an error here)."""
        try:
            await self._request("DELETE", res.path(namespace=namespace, name=name))
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    # ------------------------------------------------------------------ watch

    async def watch(
        self,
        res: Resource,
        on_page: Callable[[Page], Awaitable[None] | None],
        on_event: Callable[[WatchEvent], Awaitable[None] | None],
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        server_timeout: int | None = None,
        retry_delay: float = 1.0,
    ) -> None:
        """List, hand each page of the listing to ``on_page`` (:meth:`pages`), then stream
        changes to ``on_event``; :func:`whole_listing` turns a callback that takes every
        item at once into ``on_page``.

        Runs until cancelled. A 410 Gone (the resourceVersion fell out of the server's
        window), a dropped stream or a 5xx leads to a fresh list, so the listing must
        replace the caller's view rather than merge into it: an object no page since the
        first held is gone once the last page came. So does a server that lost the history
        the watch resumes from (it came back empty or restarted): a current resourceVersion
        behind the one the watch would resume from (checked before every resume: the
        apiserver accepts such a watch and is silent), resourceVersions going back, "too
        large resource version", or a stream that ended without a single event or bookmark.
        Failures are retried with backoff and logged once per interval, not per attempt.
        """
        timeout = server_timeout or self.watch_timeout
        name = ",".join(p for p in (res.plural, namespace, label_selector) if p)
        health = self.watches[name] = WatchHealth(progress_at=_monotonic())
        try:
            while True:
                try:
                    await self._list_and_stream(
                        res, on_page, on_event, namespace, label_selector, timeout, health
                    )
                except asyncio.CancelledError:
                    raise
                except _HistoryLost as exc:
                    _problems.warning(f"history {res.plural}", "watch %s: %s; re-listing",
                                      res.plural, exc)
                except ApiError as exc:
                    if exc.gone or _too_large(exc):
                        continue  # the window moved on: a fresh list, at once
                    await self._failed(res, health, f"{exc.status or 'no answer'} {exc.reason}",
                                       retry_delay)
                except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
                    await self._failed(res, health, type(exc).__name__, retry_delay)
                except Exception:
                    log.exception("watch %s broke, re-listing", res.plural)
                    await asyncio.sleep(retry_delay)
        finally:
            if self.watches.get(name) is health:
                del self.watches[name]

    @staticmethod
    async def _failed(res: Resource, health: WatchHealth, error: str, delay: float) -> None:
        health.error = error
        health.failures += 1
        _problems.warning(f"watch {error}", "watch %s failed (%s); re-listing with backoff",
                          res.plural, error)
        await asyncio.sleep(min(MAX_RETRY_DELAY, delay * 2 ** (health.failures - 1)))

    async def _list_and_stream(
        self,
        res: Resource,
        on_page: Callable[[Page], Awaitable[None] | None],
        on_event: Callable[[WatchEvent], Awaitable[None] | None],
        namespace: str | None,
        label_selector: str | None,
        server_timeout: int,
        health: WatchHealth,
    ) -> None:
        """List, then stream until a re-list is needed (returns, or raises)."""
        rv = ""
        async for page in self.pages(res, namespace=namespace, label_selector=label_selector):
            rv = page.resource_version
            if page.first:
                health.seen_rv = None  # a listing replaces the view, and what it saw
            health.seen_rv = _max_rv(health.seen_rv, rv)
            await _maybe_await(on_page(page))
            health.progress_at = _monotonic()
        health.progress_at, health.error = _monotonic(), None
        self._relisted()
        if health.failures:
            _problems.resolved(f"watch {res.plural}", "watch %s re-listed", res.plural)
        health.failures = 0
        resuming = False
        while True:
            # A stream that ends (server timeout, dropped connection) resumes from the last
            # resourceVersion seen, when it proved the server knows it; otherwise re-list.
            if resuming:
                await self._check_reached(res, rv, namespace)
            resuming = True
            try:
                rv, proven = await self._watch_once(
                    res, rv, on_event, namespace, label_selector, server_timeout, health
                )
            except aiohttp.ClientPayloadError:
                log.debug("watch %s stream dropped; resuming at %s", res.plural, rv)
                continue
            if not proven:
                log.debug("watch %s: a stream without events; re-listing", res.plural)
                return

    async def _check_reached(self, res: Resource, rv: str, namespace: str | None) -> None:
        """Raise :class:`_HistoryLost` when the server's current resourceVersion is behind
        ``rv``, the one a watch is about to resume from. An API server that came back with
        another etcd (empty, or restored from a backup) accepts such a watch and stays
        silent until its revisions pass it (the watch cache sends nothing older than the
        watch), up to a whole stream's length: the cache would keep the old world meanwhile.
        One item's listing (a consistent read) tells it at the cost of one small request."""
        since = _int_rv(rv)
        if since is None:
            return
        body = await self._request("GET", res.path(namespace=namespace), query={"limit": 1})
        now = _int_rv(str((body.get("metadata") or {}).get("resourceVersion", "")))
        if now is not None and now < since:
            raise _HistoryLost(
                f"the server's resourceVersion {now} is behind {rv}, where the watch would "
                "resume (it came back with another etcd)"
            )

    async def _watch_once(
        self,
        res: Resource,
        rv: str,
        on_event: Callable[[WatchEvent], Awaitable[None] | None],
        namespace: str | None,
        label_selector: str | None,
        server_timeout: int,
        health: WatchHealth | None = None,
    ) -> tuple[str, bool]:
        """One watch request; return the last resourceVersion seen and whether anything
        arrived (raise ApiError(410), _HistoryLost)."""
        health = health or WatchHealth(progress_at=_monotonic())
        stream = self._stream(res, rv, namespace, label_selector, server_timeout)
        since = _int_rv(rv)
        proven = False
        # aclosing: on cancellation the stream's response is closed now, not whenever the
        # generator is garbage-collected (until then its connection would stay half-used).
        async with contextlib.aclosing(stream) as events:
            async for ev in events:
                kind = ev.get("type")
                obj = ev.get("object") or {}
                if kind == "ERROR":
                    raise ApiError(int(obj.get("code", 500)), str(obj.get("reason", "")), str(obj))
                seen = str(obj.get("metadata", {}).get("resourceVersion", rv))
                # resourceVersions are opaque, but every server Muster meets (etcd's
                # revision) counts up: one lower than where the watch resumed means the
                # server's history began again.
                if since is not None and (now := _int_rv(seen)) is not None and now < since:
                    raise _HistoryLost(
                        f"the server's resourceVersion went back from {rv} to {seen} (it "
                        "came back empty or restarted)"
                    )
                rv, proven = seen, True
                health.progress_at = _monotonic()
                health.seen_rv = _max_rv(health.seen_rv, seen)
                if kind == "BOOKMARK":
                    continue
                await _maybe_await(on_event(WatchEvent(str(kind), obj)))
        return rv, proven

    async def _stream(
        self,
        res: Resource,
        rv: str,
        namespace: str | None,
        label_selector: str | None,
        server_timeout: int,
    ) -> AsyncGenerator[Body, None]:
        query: dict[str, str | int] = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": server_timeout,
        }
        if rv:
            query["resourceVersion"] = rv
        if label_selector:
            query["labelSelector"] = label_selector
        resp = await self._send(
            "GET", res.path(namespace=namespace), query, None, "", server_timeout + 30
        )
        try:
            if resp.status != 200:
                body = (await resp.read()).decode(errors="replace")
                raise ApiError(resp.status, str(resp.reason), body)
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                line = line.strip()
                if line:
                    yield orjson.loads(line)
        finally:
            # close, not release: an unfinished stream's connection must not be reused.
            with contextlib.suppress(Exception):
                resp.close()


def _close_quietly(task: asyncio.Future[Any]) -> None:
    if task.cancelled() or task.exception() is not None:
        return
    with contextlib.suppress(Exception):
        task.result().close()


def _no_env_lookups(api_client: k8s_client.ApiClient) -> None:
    """Stop aiohttp from reading ~/.netrc and proxy variables in a thread on every request.

    kubernetes-asyncio opens its session with ``trust_env=True``: two thread-pool hops per
    API call, a third of the client's CPU at 1,000 requests. Kept when a proxy is set.
    """
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")):
        return
    rest = api_client.rest_client
    old = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=old.connector, trust_env=False, read_bufsize=2**21
    )
    old._connector = None  # the new session owns the connector; the old one must not close it


CONNECTION_POOL_SIZE = 512


def _pooled(cfg: k8s_client.Configuration) -> k8s_client.Configuration:
    # kubernetes-asyncio sizes its pool at 5 x CPUs; every watch holds one connection for
    # minutes, so on a small machine a handful of watches would starve all other calls.
    cfg.connection_pool_maxsize = CONNECTION_POOL_SIZE
    return cfg


def _int_rv(rv: str) -> int | None:
    return int(rv) if rv.isdigit() else None


def _max_rv(current: int | None, rv: str) -> int | None:
    now = _int_rv(rv)
    if now is None:
        return current
    return now if current is None else max(current, now)


def _too_large(exc: ApiError) -> bool:
    """The apiserver's answer to a read at a resourceVersion its watch cache has not reached
    within 3 s (504 Timeout, cause ResourceVersionTooLarge)."""
    return "too large resource version" in exc.body.lower()


def _monotonic() -> float:
    return asyncio.get_running_loop().time()


async def _maybe_await(value: Awaitable[None] | None) -> None:
    if value is not None:
        await value
