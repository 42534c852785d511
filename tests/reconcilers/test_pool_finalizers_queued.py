"""A deleted CapacityPool's finalizer and the queued gangs still waiting in its cloud queue
(unit level: the cache, a recording API client, no controller): the finalizer stays while a
request of a queued class may still be queued through the pool, whether or not it was
reconciled since a restart, and such requests are woken so they cancel at once."""

from __future__ import annotations

import json
from typing import Any

from controller.api.capacitypool import POOL_FINALIZER
from controller.commands import objects
from controller.config import ClassesConfig
from controller.kube import Body
from controller.lifecycle import (
    PHASE_ANNOTATION,
    PLAN_ANNOTATION,
    QUEUED_THROUGH_ANNOTATION,
    Phase,
)
from controller.reconcilers.pools import sync_pool_finalizers
from controller.reconcilers.queued import waiting_pools
from controller.state.bookings import Booking, Group
from controller.state.cache import ClusterState
from tests.cluster_objects import plan_on

QUEUED = "queued-provisioning.muster.dev"
ATOMIC = "atomic-provisioning.muster.dev"


class RecordingKube:
    """Lists no Node and records every finalizer patch."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, Body]] = []

    async def list(self, res: Any, **_: Any) -> Body:
        return {"items": []}

    async def merge_patch(self, res: Any, name: str, patch: Body, **_: Any) -> Body:
        self.patches.append((name, patch))
        return {}


class NoMachines:
    """A provider set whose clouds hold no machine of any pool."""

    def for_pool(self, pool: Any) -> NoMachines:
        return self

    async def list(self, pool: Any) -> list[Any]:
        return []


def _pool(name: str, *, deleting: bool) -> Body:
    body = objects.gpu_pool(name, parameters={"queue": True})
    meta = body["metadata"]
    meta.update(uid=f"u-{name}", resourceVersion="7", finalizers=[POOL_FINALIZER])
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T12:00:00Z"
    return body


def _request(name: str, *, pool: str, class_name: str = QUEUED, phase: Phase = Phase.ACQUIRING,
             launched: bool = False, queued: bool = True) -> Body:
    group = Group(f"{name}-1-0", pool, {}, 2,
                  nodes=("a", "b") if launched else (),
                  provider_ids=("fake://a", "fake://b") if launched else ())
    booking = Booking(plan=plan_on([], new=2, pool=pool), attempt=1, groups=(group,))
    body = objects.provisioning_request(name, namespace="ns", pod_sets=[("workers", 2)],
                                        class_name=class_name)
    annotations = {PHASE_ANNOTATION: phase, PLAN_ANNOTATION: booking.to_annotation()}
    if queued:  # what the step records once the cloud's queue holds the group
        annotations[QUEUED_THROUGH_ANNOTATION] = json.dumps(
            {group.key: {"provider": "kind", "parameters": {"queue": True}}})
    body["metadata"].update(uid=f"u-{name}", resourceVersion="1", annotations=annotations)
    return body


def _state(*requests: Body) -> ClusterState:
    state = ClusterState(levels=[objects.BLOCK, objects.RACK])
    state.upsert_pool(_pool("gpu", deleting=True))
    state.upsert_pool(_pool("other", deleting=True))
    for body in requests:
        assert state.upsert_request(body) is not None
    return state


def _released(kube: RecordingKube) -> list[str]:
    return [name for name, patch in kube.patches
            if POOL_FINALIZER not in patch["metadata"]["finalizers"]]


def test_only_queued_requests_still_waiting_in_the_cloud_hold_their_pool() -> None:
    state = _state(
        _request("waiting", pool="gpu"),
        _request("atomic", pool="gpu", class_name=ATOMIC),
        _request("granted", pool="other", launched=True),
        _request("failed", pool="other", phase=Phase.FAILED),
        # Planned, but its step has not queued it yet: nothing in the cloud to cancel.
        _request("planned", pool="other", queued=False),
    )
    assert waiting_pools(state, ClassesConfig()) == {"gpu": ["ns/waiting"]}


async def test_a_deleted_pool_keeps_its_finalizer_while_a_queued_gang_waits_in_it() -> None:
    state = _state(_request("waiting", pool="gpu"))
    kube = RecordingKube()
    woken: list[str] = []

    await sync_pool_finalizers(kube, state, NoMachines(), ClassesConfig(),  # type: ignore[arg-type]
                               wake=woken.append)

    # "other" has nothing left and goes; "gpu" stays, and its waiting request is woken.
    assert _released(kube) == ["other"]
    assert woken == ["ns/waiting"]

    # The request cancelled and failed: the pool goes at the next pass.
    failed = _request("waiting", pool="gpu", phase=Phase.FAILED)
    failed["metadata"]["resourceVersion"] = "2"
    state.upsert_request(failed)
    kube.patches.clear()
    await sync_pool_finalizers(kube, state, NoMachines(), ClassesConfig(),  # type: ignore[arg-type]
                               wake=woken.append)
    assert sorted(_released(kube)) == ["gpu", "other"]
    assert woken == ["ns/waiting"]


class FailingList:
    """A provider set whose listing fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def for_pool(self, pool: Any) -> FailingList:
        return self

    async def list(self, pool: Any) -> list[Any]:
        raise self.error


async def test_a_deleted_pool_whose_cloud_cannot_answer_now_is_kept() -> None:
    """A listing that fails for now (throttled, the cloud's API down) may hide machines: the
    finalizer stays until the provider can say none is left."""
    from providers.base import TransientProviderError

    state, kube = _state(), RecordingKube()
    await sync_pool_finalizers(kube, state,  # type: ignore[arg-type]
                               FailingList(TransientProviderError("503 from the cloud")),
                               ClassesConfig())
    assert _released(kube) == []


async def test_a_deleted_pool_whose_provider_cannot_be_set_up_goes() -> None:
    """A provider that cannot be set up for the pool at all (no credentials) launched
    nothing with it and can release nothing: the pool is not held for good."""
    from providers.base import ProviderConfigError

    state, kube = _state(), RecordingKube()
    await sync_pool_finalizers(kube, state,  # type: ignore[arg-type]
                               FailingList(ProviderConfigError("no credentials")),
                               ClassesConfig())
    assert sorted(_released(kube)) == ["gpu", "other"]
