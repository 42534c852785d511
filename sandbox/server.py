"""The sandbox's HTTP front end: the Kubernetes REST API (discovery, CRUD, PATCH, apply,
status and binding subresources, watch) served by aiohttp on 127.0.0.1 over ``Store``.

``SandboxServer`` starts and stops it, writes a kubeconfig that kubectl and
kubernetes-asyncio accept, and exposes ``store`` (in-process access) and ``faults``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import yaml
from aiohttp import web

from sandbox import errors, yamlio
from sandbox.errors import ApiError, bad_request
from sandbox.faults import Faults
from sandbox.resources import ResourceType
from sandbox.selectors import FieldSelector, LabelSelector
from sandbox.store import CONTENT_TYPES, Store
from sandbox.tables import table as _table
from sandbox.watch import Watcher, WatchEvent

KUBE_VERSION = {
    "major": "1", "minor": "32", "gitVersion": "v1.32.0-muster-sandbox",
    "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23", "compiler": "gc",
    "platform": "linux/amd64",
}
_TRUE = frozenset({"true", "True", "1", "yes"})
FRESH_WAIT_SECONDS = 3.0
"""How long a read at a resourceVersion ahead of the store waits for it (the apiserver's
``blockTimeout``)."""
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
_Number = TypeVar("_Number", int, float)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=_dumps(obj), status=status, content_type="application/json")


def _error_response(err: ApiError) -> web.Response:
    resp = _json_response(err.status(), err.code)
    if err.retry_after is not None:
        resp.headers["Retry-After"] = str(err.retry_after)
    return resp


@dataclass
class Target:
    """A parsed resource URL."""

    rt: ResourceType
    version: str
    namespace: str | None
    name: str | None
    subresource: str | None
    watch_path: bool


def _wants_table(request: web.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


def _query_number(
    query: Mapping[str, str], name: str, parse: Callable[[str], _Number],
) -> _Number | None:
    """The query parameter ``name`` parsed by ``parse``; None when absent or empty.

    A malformed value is the client's fault, so it is a 400 rather than a 500.
    """
    raw = query.get(name)
    try:
        return parse(raw) if raw else None
    except ValueError as exc:
        raise bad_request(f"invalid {name} {raw!r}") from exc


class SandboxServer:
    """An in-process Kubernetes API server on 127.0.0.1 (see module docstring)."""

    def __init__(
        self,
        *,
        port: int = 0,
        store: Store | None = None,
        seed: int | None = None,
        bookmark_interval: float = 1.0,
        crd_dir: str | Path | None = None,
    ) -> None:
        self.store = store if store is not None else Store(seed=seed)
        self.faults = Faults(seed=seed)
        self.faults.closer = self._close_watches
        self.bookmark_interval = bookmark_interval
        self.requests: Counter[tuple[str, str]] = Counter()
        self._port = port
        self._runner: web.AppRunner | None = None
        self._sock: socket.socket | None = None
        self._watchers: set[Watcher] = set()
        self.tokens: dict[str, dict[str, Any]] = {}
        """Bearer token -> user info (``username``, ``uid``, ``groups``) that a TokenReview
        answers with; any other token is not authenticated."""
        self.non_resource_grants: set[tuple[str, str, str]] = set()
        """``(username or group, verb, path)`` a SubjectAccessReview on a non-resource URL
        allows (RBAC's ``nonResourceURLs`` rules, without wildcards); everything else is
        denied."""
        self.reviews: list[dict[str, Any]] = []
        """Every TokenReview and SubjectAccessReview answered, with its status."""
        self.etcd: Store | None = None
        """Where writes and gets go while :meth:`wipe_storage` holds (else ``store``)."""
        if crd_dir is not None:
            self.store.load_crd_dir(crd_dir)

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        if self._sock is None:
            raise RuntimeError("the sandbox server is not started")
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> SandboxServer:
        if self._runner is not None:
            return self
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=1.0,
        )
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._port))
        sock.listen(512)
        sock.setblocking(False)
        self._sock = sock
        await web.SockSite(self._runner, sock).start()
        return self

    async def stop(self) -> None:
        self._close_watches(frozenset())
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def __aenter__(self) -> SandboxServer:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "muster-sandbox", "cluster": {"server": self.url}}],
            "users": [{"name": "muster-sandbox", "user": {"token": "sandbox"}}],
            "contexts": [{
                "name": "muster-sandbox",
                "context": {"cluster": "muster-sandbox", "user": "muster-sandbox",
                            "namespace": namespace},
            }],
            "current-context": "muster-sandbox",
            "preferences": {},
        }

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        """Write a kubeconfig (plain http cluster entry) for kubectl and kubernetes-asyncio."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(yaml.safe_dump(self.kubeconfig(namespace), sort_keys=False))
        return out

    def replace_store(self, store: Store) -> None:
        """Serve ``store`` from now on and end every open watch: an API server that came
        back with another etcd (empty, or restored from a backup), whose resourceVersions
        start again."""
        self._close_watches(frozenset())
        self.store = store
        self.etcd = None

    def wipe_storage(self, etcd: Store) -> None:
        """Write to ``etcd`` from now on while lists and watches keep serving the old store:
        etcd wiped (or restored from a backup) under a running kube-apiserver. Its watch
        cache keeps the old objects and resourceVersions (its own watch on etcd resumes from
        a revision the new etcd has not reached, and waits), while writes, and gets, which
        read etcd, reach the new one. :meth:`replace_store` is the restart that ends it."""
        self.etcd = etcd

    @property
    def _storage(self) -> Store:
        """What writes and gets reach: the store, or the new etcd after :meth:`wipe_storage`."""
        return self.etcd if self.etcd is not None else self.store

    def _close_watches(self, resources: frozenset[str]) -> int:
        closed = 0
        for w in list(self._watchers):
            group, plural = w.resource
            if resources and not ({plural, f"{plural}.{group}"} & resources):
                continue
            w.close("closed by fault injection")
            closed += 1
        return closed

    # ------------------------------------------------------------------ routing

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._route(request)
        except ApiError as err:
            return _error_response(err)
        except ConnectionError:
            # The client closed the connection mid-response; nothing can be sent any more.
            return web.Response(status=499)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a server bug must answer 500, like the apiserver, not hang
            return _error_response(ApiError(500, "InternalError", f"internal error: {exc!r}"))

    async def _route(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if not parts:
            return _json_response({"paths": ["/api", "/api/v1", "/apis", "/version"]})
        head = parts[0]
        if head == "version" and len(parts) == 1:
            return _json_response(KUBE_VERSION)
        if head in ("healthz", "readyz", "livez"):
            return web.Response(text="ok")
        if head == "openapi" and len(parts) >= 2 and parts[1] == "v3":
            return _json_response(self._openapi_v3("/".join(parts[2:])))
        if request.method == "POST" and request.path in (TOKEN_REVIEWS, SUBJECT_ACCESS_REVIEWS):
            return await self._review(request)
        if head == "api":
            return await self._core_api(request, parts)
        if head == "apis":
            return await self._group_api(request, parts)
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    async def _core_api(self, request: web.Request, parts: list[str]) -> web.StreamResponse:
        if len(parts) == 1:
            return _json_response({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}
                ],
            })
        if len(parts) == 2:
            return self._resource_list("", parts[1])
        return await self._resource(request, "", parts[1], parts[2:])

    async def _group_api(self, request: web.Request, parts: list[str]) -> web.StreamResponse:
        if len(parts) == 1:
            return _json_response(self._group_list())
        if len(parts) == 2:
            group = self._group(parts[1])
            if group is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return _json_response({"kind": "APIGroup", "apiVersion": "v1", **group})
        if len(parts) == 3:
            return self._resource_list(parts[1], parts[2])
        return await self._resource(request, parts[1], parts[2], parts[3:])

    async def _review(self, request: web.Request) -> web.Response:
        """TokenReview and SubjectAccessReview (create only, nothing stored), answered from
        ``tokens`` and ``non_resource_grants``: what a delegating authenticator and
        authorizer (controller-runtime's secure metrics, kube-rbac-proxy) ask the API
        server."""
        body = await self._body(request)
        spec = body.get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict):
            raise bad_request("a review needs a spec")
        status: dict[str, Any]
        if request.path == TOKEN_REVIEWS:
            user = self.tokens.get(str(spec.get("token", "")))
            status = {"authenticated": True, "user": dict(user)} if user else {
                "authenticated": False, "error": "invalid bearer token"}
        else:
            attrs = spec.get("nonResourceAttributes") or {}
            subjects = [str(spec.get("user", "")), *map(str, spec.get("groups") or [])]
            allowed = bool(attrs) and any(
                (who, attrs.get("verb"), attrs.get("path")) in self.non_resource_grants
                for who in subjects)
            status = {"allowed": allowed}
            if not allowed:
                status["reason"] = "no RBAC rule allows it (sandbox non_resource_grants)"
        out = {**body, "status": status}
        self.reviews.append(out)
        return _json_response(out, 201)

    # ------------------------------------------------------------------ discovery

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for rt in self.store.registry.all():
            if not rt.group:
                continue
            versions = groups.setdefault(rt.group, [])
            for v in rt.versions:
                if v not in versions:
                    versions.append(v)
        return groups

    def _group(self, name: str) -> dict[str, Any] | None:
        versions = self._groups().get(name)
        if not versions:
            return None
        entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {"name": name, "versions": entries, "preferredVersion": entries[0]}

    def _group_list(self) -> dict[str, Any]:
        groups = [self._group(name) for name in sorted(self._groups())]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [g for g in groups if g]}

    def _resource_list(self, group: str, version: str) -> web.Response:
        resources: list[dict[str, Any]] = []
        for rt in self.store.registry.all():
            if rt.group != group or version not in rt.versions:
                continue
            entry: dict[str, Any] = {
                "name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch",
                          "update", "watch"],
            }
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            resources.append(entry)
            if rt.status_subresource:
                resources.append({
                    "name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced,
                    "kind": rt.kind, "verbs": ["get", "patch", "update"],
                })
            if "binding" in rt.extra_subresources:
                resources.append({
                    "name": f"{rt.plural}/binding", "singularName": "",
                    "namespaced": rt.namespaced, "kind": "Binding", "verbs": ["create"],
                })
        if not resources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        gv = f"{group}/{version}" if group else version
        return _json_response({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
            "resources": resources,
        })

    def _openapi_v3(self, gv_path: str) -> dict[str, Any]:
        """A minimal OpenAPI v3 index and per-group-version documents.

        They carry no schemas: only the operations, each tagged with its group-version-kind and
        the ``fieldValidation`` query parameter, which tells kubectl that the server validates
        fields itself (so ``kubectl apply`` skips client-side schema validation). The sandbox
        accepts ``fieldValidation`` and does not validate fields.
        """
        versions: dict[str, list[ResourceType]] = {}
        for rt in self.store.registry.all():
            for v in rt.versions:
                prefix = f"apis/{rt.group}/{v}" if rt.group else f"api/{v}"
                versions.setdefault(prefix, []).append(rt)
        if not gv_path:
            return {"paths": {
                p: {"serverRelativeURL": f"/openapi/v3/{p}?hash={self.store.resource_version}"}
                for p in sorted(versions)
            }}
        if gv_path not in versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        version = gv_path.rsplit("/", 1)[1]
        param = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}]
        paths: dict[str, Any] = {}
        for rt in versions[gv_path]:
            gvk = {"group": rt.group, "version": version, "kind": rt.kind}
            base = f"/{gv_path}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced \
                else f"/{gv_path}/{rt.plural}"

            def op(action: str, gvk: dict[str, str] = gvk) -> dict[str, Any]:
                return {"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
                        "parameters": param, "responses": {"200": {"description": "OK"}}}

            paths[base] = {"post": op("post"), "get": op("list")}
            paths[f"{base}/{{name}}"] = {"get": op("get"), "put": op("put"),
                                        "patch": op("patch"), "delete": op("delete")}
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"},
                "paths": paths, "components": {"schemas": {}}}

    # ------------------------------------------------------------------ resources

    def _parse(self, group: str, version: str, segs: list[str]) -> Target:
        reg = self.store.registry
        watch_path = False
        if segs and segs[0] == "watch":
            watch_path = True
            segs = segs[1:]
        namespace = None
        if len(segs) >= 3 and segs[0] == "namespaces":
            candidate = reg.lookup(group, version, segs[2])
            if candidate is not None and candidate.namespaced:
                namespace = segs[1]
                segs = segs[2:]
        if not segs or len(segs) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        rt = reg.lookup(group, version, segs[0])
        if rt is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = segs[1] if len(segs) > 1 else None
        sub = segs[2] if len(segs) > 2 else None
        if rt.namespaced and name is not None and namespace is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub is not None and not (
            (sub == "status" and rt.status_subresource) or sub in rt.extra_subresources
        ):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return Target(rt, version, namespace, name, sub, watch_path)

    @staticmethod
    def _verb(request: web.Request, t: Target) -> str:
        method = request.method
        if method == "GET":
            if t.watch_path or request.query.get("watch", "") in _TRUE:
                return "watch"
            return "get" if t.name else "list"
        if method == "POST":
            return "create"
        if method == "PUT":
            return "update"
        if method == "PATCH":
            return "patch"
        if method == "DELETE":
            return "delete" if t.name else "deletecollection"
        raise ApiError(405, "MethodNotAllowed", f"method {method} is not allowed")

    async def _apply_faults(self, verb: str, t: Target) -> None:
        for rule in list(self.faults.rules):
            if (not rule.applies(verb, t.rt.plural, t.rt.group, t.subresource)
                    or not self.faults.draw(rule)):
                continue
            self.faults.injected += 1
            if rule.kind == "latency":
                await asyncio.sleep(rule.seconds)
            elif rule.kind == "error":
                if rule.status == 429:
                    raise ApiError(429, "TooManyRequests", "injected fault: too many requests",
                                   retry_after=1)
                reason = "ServiceUnavailable" if rule.status == 503 else "InternalError"
                raise ApiError(rule.status, reason, f"injected fault: HTTP {rule.status}")
            elif rule.kind == "conflict":
                raise errors.conflict(t.rt.plural, t.rt.group, t.name or "", "injected conflict")

    async def _body(self, request: web.Request, *, yaml_ok: bool = False) -> Any:
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        if "protobuf" in ctype or "cbor" in ctype:
            # The sandbox speaks JSON only; client-go falls back to JSON on 415.
            raise ApiError(
                415, "UnsupportedMediaType",
                f'the body of the request was in an unknown format - accepted media types '
                f'include: application/json, application/yaml (got "{ctype}")',
            )
        raw = await request.read()
        if not raw:
            return None
        try:
            if yaml_ok:
                return yamlio.load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise bad_request(f"the request body is not valid {'YAML' if yaml_ok else 'JSON'}: "
                              f"{exc}") from exc

    async def _resource(
        self, request: web.Request, group: str, version: str, segs: list[str],
    ) -> web.StreamResponse:
        t = self._parse(group, version, segs)
        verb = self._verb(request, t)
        self.requests[(verb, t.rt.plural)] += 1
        await self._apply_faults(verb, t)
        resp = await self._serve(request, t, verb)
        warning = t.rt.deprecations.get(t.version)
        if warning and not resp.prepared:
            # Deprecated CRD versions warn like the apiserver (kubectl prints "Warning: ...").
            resp.headers["Warning"] = '299 - "' + warning.replace('"', "'") + '"'
        return resp

    async def _serve(self, request: web.Request, t: Target, verb: str) -> web.StreamResponse:
        q = request.query
        dry_run = q.get("dryRun") == "All"
        store = self._storage
        if verb == "watch":
            return await self._watch(request, t)
        if verb in ("list", "get"):
            return await self._read(request, t, verb)
        if verb == "create":
            body = await self._body(request)
            if t.subresource == "binding":
                return self._bind(t, body)
            if t.name is not None:
                raise ApiError(405, "MethodNotAllowed", "POST is not allowed on a named object")
            if not isinstance(body, dict):
                raise bad_request("the request body must be a JSON object")
            obj = store.create_raw(
                t.rt, body, t.namespace, version=t.version, dry_run=dry_run,
                field_manager=q.get("fieldManager"),
            )
            return self._object_response(request, t, obj, 201)
        if verb == "update":
            assert t.name is not None
            body = await self._body(request)
            if not isinstance(body, dict):
                raise bad_request("the request body must be a JSON object")
            obj = store.replace_raw(
                t.rt, t.name, body, t.namespace, subresource=t.subresource, version=t.version,
                dry_run=dry_run, field_manager=q.get("fieldManager"),
            )
            return self._object_response(request, t, obj)
        if verb == "patch":
            return await self._patch(request, t, dry_run)
        if verb == "delete":
            return await self._delete(request, t, dry_run)
        return await self._delete_collection(request, t)

    def _object_response(
        self, request: web.Request, t: Target, obj: Mapping[str, Any], status: int = 200,
    ) -> web.Response:
        out: Any = obj
        if obj.get("apiVersion") != t.rt.api_version(t.version):
            out = {**obj, "apiVersion": t.rt.api_version(t.version)}
        if _wants_table(request) and request.method == "GET":
            out = _table(t.rt, [out], str(obj["metadata"].get("resourceVersion", "")),
                         version=t.version)
        return _json_response(out, status)

    async def _read(self, request: web.Request, t: Target, verb: str) -> web.Response:
        await self._wait_fresh(request.query.get("resourceVersion"))
        if verb == "list":
            return self._list(request, t)
        assert t.name is not None
        obj = self._storage.get_raw(t.rt, t.name, t.namespace)
        return self._object_response(request, t, obj)

    async def _wait_fresh(self, resource_version: str | None) -> None:
        """A read at a resourceVersion the store has not reached waits up to
        :data:`FRESH_WAIT_SECONDS` for it, then fails like the apiserver's watch cache
        (``waitUntilFreshAndBlock``): 504, "Too large resource version"."""
        try:
            wanted = int(resource_version or 0)
        except ValueError:
            return  # the store's own parsing refuses it
        deadline = time.monotonic() + FRESH_WAIT_SECONDS
        while wanted > self.store.resource_version:
            if time.monotonic() >= deadline:
                raise errors.too_large_resource_version(wanted, self.store.resource_version)
            await asyncio.sleep(0.05)

    def _list(self, request: web.Request, t: Target) -> web.Response:
        q = request.query
        limit = _query_number(q, "limit", int)
        items, rv, token = self.store.list_raw(
            t.rt, t.namespace, LabelSelector.parse(q.get("labelSelector")),
            FieldSelector.parse(q.get("fieldSelector")), limit=limit,
            continue_token=q.get("continue") or None,
        )
        api_version = t.rt.api_version(t.version)
        if len(t.rt.versions) > 1:
            items = [o if o.get("apiVersion") == api_version else {**o, "apiVersion": api_version}
                     for o in items]
        if _wants_table(request):
            return _json_response(_table(t.rt, items, rv, token, version=t.version))
        meta: dict[str, Any] = {"resourceVersion": rv}
        if token:
            meta["continue"] = token
        return _json_response({
            "kind": t.rt.list_kind, "apiVersion": api_version, "metadata": meta, "items": items,
        })

    def _bind(self, t: Target, body: Any) -> web.Response:
        if t.rt.key != ("", "pods") or t.name is None or t.namespace is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        target = (body or {}).get("target") if isinstance(body, dict) else None
        if not isinstance(target, dict) or not target.get("name"):
            raise bad_request("a Binding needs target.name")
        self._storage.bind(t.name, t.namespace, str(target["name"]))
        return _json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
             "code": 201},
            201,
        )

    async def _patch(self, request: web.Request, t: Target, dry_run: bool) -> web.Response:
        assert t.name is not None
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        patch_type = CONTENT_TYPES.get(ctype)
        if patch_type is None:
            raise ApiError(
                415, "UnsupportedMediaType",
                f"the body of the request was in an unknown format ({ctype!r}) - accepted media "
                "types include: " + ", ".join(CONTENT_TYPES),
            )
        body = await self._body(request, yaml_ok=patch_type == "apply")
        if body is None:
            raise bad_request("the patch body is empty")
        q = request.query
        existed = (t.namespace or "", t.name) in self._storage.table(t.rt).objects
        obj = self._storage.patch_raw(
            t.rt, t.name, body, t.namespace, patch_type=patch_type, subresource=t.subresource,
            version=t.version, dry_run=dry_run, field_manager=q.get("fieldManager"),
            force=q.get("force", "") in _TRUE,
        )
        # Server-side apply that creates the object answers 201, like a POST.
        return self._object_response(request, t, obj, 200 if existed else 201)

    async def _delete_options(self, request: web.Request) -> dict[str, Any]:
        body = await self._body(request) if request.can_read_body else None
        opts: dict[str, Any] = body if isinstance(body, dict) else {}
        q = request.query
        if q.get("propagationPolicy"):
            opts["propagationPolicy"] = q["propagationPolicy"]
        if q.get("dryRun") == "All":
            opts["dryRun"] = ["All"]
        if opts.get("orphanDependents") is True and "propagationPolicy" not in opts:
            opts["propagationPolicy"] = "Orphan"
        return opts

    async def _delete(self, request: web.Request, t: Target, dry_run: bool) -> web.Response:
        assert t.name is not None
        opts = await self._delete_options(request)
        obj = self._storage.delete_raw(
            t.rt, t.name, t.namespace, propagation=opts.get("propagationPolicy"),
            preconditions=opts.get("preconditions"),
            dry_run=dry_run or "All" in (opts.get("dryRun") or []),
        )
        # 200 with the object, also while finalizers hold it (the apiserver answers 202 only
        # for orphanDependents=false requests).
        return self._object_response(request, t, obj)

    async def _delete_collection(self, request: web.Request, t: Target) -> web.Response:
        opts = await self._delete_options(request)
        q = request.query
        items, _, _ = self.store.list_raw(
            t.rt, t.namespace, LabelSelector.parse(q.get("labelSelector")),
            FieldSelector.parse(q.get("fieldSelector")),
        )
        deleted = []
        for obj in list(items):
            meta = obj["metadata"]
            with contextlib.suppress(ApiError):
                deleted.append(self.store.delete_raw(
                    t.rt, meta["name"], meta.get("namespace"),
                    propagation=opts.get("propagationPolicy"),
                ))
        return _json_response({
            "kind": t.rt.list_kind, "apiVersion": t.rt.api_version(t.version),
            "metadata": {"resourceVersion": str(self.store.resource_version)}, "items": deleted,
        })

    # ------------------------------------------------------------------ watch

    async def _watch(self, request: web.Request, t: Target) -> web.StreamResponse:
        q = request.query
        timeout = _query_number(q, "timeoutSeconds", float)
        bookmarks = q.get("allowWatchBookmarks", "") in _TRUE
        initial_end = q.get("sendInitialEvents", "") in _TRUE
        labels = LabelSelector.parse(q.get("labelSelector"))
        fields = FieldSelector.parse(q.get("fieldSelector"))
        if t.name is not None:
            fields = FieldSelector([*fields.requirements,
                                    *FieldSelector.parse(f"metadata.name={t.name}").requirements])
        table_mode = _wants_table(request)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        try:
            watcher = self.store.watch_raw(
                t.rt, t.namespace, q.get("resourceVersion"), labels, fields, version=t.version,
            )
        except ApiError as err:
            if err.code != 410:
                raise
            # The apiserver reports an expired resourceVersion inside the stream.
            with contextlib.suppress(ConnectionError):
                await resp.prepare(request)
                await resp.write(_dumps({"type": "ERROR", "object": err.status()}) + b"\n")
                await resp.write_eof()
            return resp
        self._watchers.add(watcher)
        try:
            await resp.prepare(request)
            if initial_end and bookmarks:
                await self._write_events(resp, t, watcher.queue, table_mode)
                watcher.queue.clear()
                await resp.write(self._bookmark(t, initial_end=True))
            await self._pump(request, resp, t, watcher, timeout, bookmarks, table_mode)
        except ConnectionError:
            pass  # the client went away; its watcher is closed below
        finally:
            watcher.close()
            self._watchers.discard(watcher)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await resp.write_eof()
        return resp

    def _bookmark(self, t: Target, *, initial_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(self.store.resource_version)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return _dumps({"type": "BOOKMARK", "object": {
            "kind": t.rt.kind, "apiVersion": t.rt.api_version(t.version), "metadata": meta,
        }}) + b"\n"

    async def _write_events(
        self, resp: web.StreamResponse, t: Target, batch: Any, table_mode: bool,
    ) -> None:
        if not batch:
            return
        if table_mode:
            chunks = []
            for type_, ev in batch:
                obj = ev.obj
                chunks.append(_dumps({"type": type_, "object": _table(
                    t.rt, [obj], str(obj["metadata"].get("resourceVersion", "")),
                    version=t.version)}) + b"\n")
            await resp.write(b"".join(chunks))
            return
        api_version = t.rt.api_version(t.version) if len(t.rt.versions) > 1 else None
        await resp.write(b"".join(ev.line(type_, api_version) for type_, ev in batch))

    async def _pump(
        self, request: web.Request, resp: web.StreamResponse, t: Target, watcher: Watcher,
        duration: float | None, bookmarks: bool, table_mode: bool,
    ) -> None:
        deadline = time.monotonic() + duration if duration is not None else None
        drop_every = self.faults.watch_drop_applies(t.rt.plural, t.rt.group)
        sent = 0
        while True:
            wait = self.bookmark_interval if bookmarks else 5.0
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                wait = min(wait, remaining)
            batch: list[tuple[str, WatchEvent]] = await watcher.next_batch(wait)
            if batch:
                if drop_every and sent + len(batch) >= drop_every:
                    batch = batch[: drop_every - sent]
                    await self._write_events(resp, t, batch, table_mode)
                    return
                sent += len(batch)
                await self._write_events(resp, t, batch, table_mode)
            elif watcher.closed:
                return
            else:
                transport = request.transport
                if transport is None or transport.is_closing():
                    return
                if bookmarks and self.store.resource_version >= watcher.since:
                    # None while the store is behind the watch (cacheWatcher.process sends
                    # nothing older than the watch's resourceVersion).
                    await resp.write(self._bookmark(t))
