"""The kopf handlers: thin, they only feed the cache and enqueue keys.

kopf watches ProvisioningRequests (list-then-watch, reconnects, per-object workers) and
calls :func:`build_registry`'s ``on_request`` for every event; the reconcile itself runs in
:class:`controller.reconcilers.service.ProvisioningService` through the work queue, so a
request waiting for nodes never holds up kopf's event stream.

kopf pitfalls handled here: event handlers only (change handlers would write kopf progress
annotations and, on foreign CRDs, their return values to a status the API server prunes);
Muster's own finalizer instead of kopf's; no posting of kopf events; standalone (no peering
CRDs); login from Muster's own kubeconfig.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import kopf

from controller.kube.resources import PROVISIONING_REQUESTS

Observer = Callable[[str | None, Mapping[str, Any]], None]


def build_registry(
    *,
    observe: Observer,
    connection: Callable[[], kopf.ConnectionInfo],
    probe: Callable[[], Mapping[str, Any]],
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    res = PROVISIONING_REQUESTS

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings)

    @kopf.on.event(res.group, res.version, res.plural, registry=registry)
    async def on_request(event: Mapping[str, Any], **_: Any) -> None:
        # Async so kopf calls it on the event loop: kopf runs sync handlers in a thread
        # pool, and ``observe`` touches the cache and the asyncio work queue, which are
        # not thread-safe (and the thread hop cost more than the handler itself).
        observe(event.get("type"), event.get("object") or {})

    @kopf.on.probe(id="muster", registry=registry)
    def health(**_: Any) -> Mapping[str, Any]:
        return probe()

    return registry


class NoDiffBase(kopf.DiffBaseStorage):
    """A diff base that is never kept: the last-handled state exists for change handlers,
    and Muster registers event handlers only.

    kopf still builds one for every event (a deep copy of the whole body, plan annotation
    and status included), which was a tenth of kopf's cost per event at 1,000 requests.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def configure_settings(settings: kopf.OperatorSettings) -> None:
    settings.posting.enabled = False
    settings.peering.standalone = True
    settings.persistence.finalizer = "kopf.muster.dev/unused"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="kopf.muster.dev"
    )
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    # kopf 1.45 still waits ``_batch_window`` (0.1 s) for more events of an object before
    # handling the latest (the public setting is deprecated and warns). The handler only
    # stores the body, so waiting buys nothing: measured 9 -> 37 requests/s at 300 requests.
    if hasattr(settings.queueing, "_batch_window"):
        settings.queueing._batch_window = 0.01
