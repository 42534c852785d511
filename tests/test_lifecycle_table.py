"""The request life cycle's transition table (controller/lifecycle.py), row by row.

Each case puts one request in a phase, drives the reconcile (or, where reaching the state
needs a cloud, the one step that takes the row) against a fake API client that records every
write, and checks the rows taken, their writes in order and the phase the request ends in. A
reconcile that takes a transition the table does not hold raises, and every row has a case.
"""

from __future__ import annotations

import copy
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from controller import lifecycle
from controller.commands import objects
from controller.common.clock import ManualClock
from controller.common.conditions import Reason, rfc3339
from controller.config import MusterConfig
from controller.kube import Body
from controller.lifecycle import (
    FINALIZER,
    PHASE_ANNOTATION,
    PLAN_ANNOTATION,
    TABLE,
    Event,
    NotInTable,
    Phase,
    Row,
)
from controller.reconcilers import queued
from controller.reconcilers.provisioning.service import ProvisioningService
from controller.state.bookings import Booking, Group
from controller.state.cache import ClusterState
from controller.state.planner import Planner
from controller.state.requests import RequestRecord
from providers.base import QueuedStatus
from tests.cluster_objects import plan_on

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
KEY = "ns/gang"


class FakeKube:
    """One ProvisioningRequest, merge patches applied to it, and a log of every write in the
    table's vocabulary (``annotations: …``, ``finalizer: +``, ``status: …``)."""

    def __init__(self, body: Body) -> None:
        self.body = copy.deepcopy(body)
        self.writes: list[tuple[str, Any]] = []

    def _bump(self) -> Body:
        meta = self.body["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return copy.deepcopy(self.body)

    async def get_or_none(self, res: Any, name: str, *, namespace: str | None = None) -> Body:
        return copy.deepcopy(self.body)

    async def merge_patch(self, res: Any, name: str, patch: Body, *,
                          namespace: str | None = None) -> Body:
        meta = patch["metadata"]
        held = self.body["metadata"].setdefault("annotations", {})
        if meta.get("annotations"):
            self.writes.append(("annotations", dict(meta["annotations"])))
            for k, v in meta["annotations"].items():
                if v is None:
                    held.pop(k, None)
                else:
                    held[k] = v
        if "finalizers" in meta:
            before = FINALIZER in (self.body["metadata"].get("finalizers") or [])
            after = FINALIZER in meta["finalizers"]
            if before != after:
                self.writes.append(("finalizer", "+" if after else "-"))
            self.body["metadata"]["finalizers"] = list(meta["finalizers"])
        return self._bump()

    async def patch_status(self, res: Any, name: str, status: Body, *,
                           namespace: str | None = None) -> Body:
        before = {c["type"]: c for c in (self.body.get("status") or {}).get("conditions") or []}
        self.writes.append(("status", (before, list(status["conditions"]))))
        self.body.setdefault("status", {}).update(copy.deepcopy(status))
        return self._bump()


def _matches(write: str, actual: tuple[str, Any]) -> bool:
    kind, _, what = write.partition(": ")
    if kind != actual[0]:
        return False
    if kind == "finalizer":
        return bool(actual[1] == what)
    if kind == "annotations":
        want = dict(item.split("=", 1) for item in what.split(", "))
        got = {k.removeprefix("muster.dev/"): v for k, v in actual[1].items()}
        if set(want) != set(got):
            return False
        for k, pattern in want.items():
            v = got[k]
            ok = (v is None if pattern == "-" else v is not None if pattern == "…"
                  else v is not None and v.isdigit() if pattern == "n"
                  else v is None or v.isdigit() if pattern == "n|-" else v == pattern)
            if not ok:
                return False
        return True
    before, conditions = actual[1]
    by_type = {c["type"]: c for c in conditions}
    named: set[str] = set()
    for item in what.split(", "):
        types, _, status = item.partition("=")
        options = types.split("|")
        named.update(options)
        if not any(by_type.get(t, {}).get("status") == status for t in options):
            return False
    # Nothing but the named conditions changes.
    return all(before.get(t) == c for t, c in by_type.items() if t not in named)


def assert_writes(rows: list[Row], writes: list[tuple[str, Any]]) -> None:
    """``writes`` are the rows' writes in order; a write marked ``?`` may be left out."""
    expected = [w for row in rows for w in row.writes]
    i = 0
    for write in expected:
        optional = write.endswith(" ?")
        text = write.removesuffix(" ?")
        if i < len(writes) and _matches(text, writes[i]):
            i += 1
        elif not optional:
            raise AssertionError(f"missing write {write!r}; got {writes[i:]!r}")
    assert i == len(writes), f"writes the rows do not hold: {writes[i:]!r}"


@dataclass
class World:
    service: ProvisioningService
    state: ClusterState
    kube: FakeKube
    clock: ManualClock
    taken: list[Row]

    def record(self) -> RequestRecord:
        req = self.state.objects.request(KEY)
        assert req is not None
        return req


def _request(*, annotations: Mapping[str, str] | None = None,
             conditions: list[dict[str, Any]] | None = None, created: datetime = NOW,
             deleting: bool = False, finalizer: bool = False, template: str = "workers") -> Body:
    body = objects.provisioning_request("gang", namespace="ns", pod_sets=[(template, 1)])
    meta = body["metadata"]
    meta.update(uid="u-1", resourceVersion="1", generation=1,
                creationTimestamp=rfc3339(created), annotations=dict(annotations or {}))
    if deleting:
        meta["deletionTimestamp"] = rfc3339(NOW)
    if finalizer:
        meta["finalizers"] = [FINALIZER]
    if conditions:
        body["status"] = {"conditions": conditions}
    return body


def _cond(type_: str, status: str, reason: str, at: datetime = NOW) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": "m",
            "lastTransitionTime": rfc3339(at), "observedGeneration": 1}


def _booking(*, groups: tuple[Group, ...] = ()) -> Booking:
    return Booking(plan=plan_on(["n1"]), attempt=1, groups=groups)


@pytest.fixture
async def make() -> AsyncIterator[Callable[[Body], World]]:
    planners: list[Planner] = []

    def build(body: Body) -> World:
        clock = ManualClock(start=NOW)
        state = ClusterState(levels=[objects.BLOCK, objects.RACK])
        state.upsert_node(objects.node("n1", allocatable={"cpu": "8", "memory": "32Gi"}))
        tmpl = objects.pod_template("workers", namespace="ns", requests={"cpu": "1"})
        tmpl["metadata"].update(uid="t-1", resourceVersion="1")
        state.upsert_template(tmpl)
        huge = objects.pod_template("huge", namespace="ns", requests={"cpu": "64"})
        huge["metadata"].update(uid="t-2", resourceVersion="1")
        state.upsert_template(huge)
        kube = FakeKube(body)
        state.upsert_request(copy.deepcopy(body))
        planner = Planner(state, now=clock.now)
        planner.start()
        planners.append(planner)
        service = ProvisioningService(
            kube=cast(Any, kube), state=state, planner=planner, providers=cast(Any, None),
            config=MusterConfig(), clock=clock,
        )
        taken: list[Row] = []
        take = service.take

        def recording(req: RequestRecord, event: Event) -> Row:
            row = take(req, event)
            taken.append(row)
            return row

        service.take = recording  # type: ignore[method-assign]
        return World(service, state, kube, clock, taken)

    yield build
    for planner in planners:
        await planner.stop()


Drive = Callable[[World], Awaitable[object]]


async def _reconcile(w: World) -> object:
    return await w.service.reconcile(KEY)


def _acquiring() -> Body:
    return _request(annotations={PHASE_ANNOTATION: Phase.ACQUIRING, "muster.dev/attempt": "1",
                                 PLAN_ANNOTATION: _booking().to_annotation()})


_LONG_AGO = NOW - timedelta(days=1)
_PROVISIONED = _cond("Provisioned", "True", Reason.CAPACITY_IS_FOUND)
_ACCEPTED = _cond("Accepted", "True", Reason.ACCEPTED)


@dataclass(frozen=True)
class Case:
    name: str
    body: Callable[[], Body]
    rows: tuple[tuple[Phase, Event], ...]
    end: Phase | None
    drive: Drive = _reconcile
    woken: bool = False


async def _announce(w: World) -> object:
    group = Group("k-1", "gpu", {}, 2)
    return await w.service._announce(w.record(), _booking(groups=(group,)))


async def _launched(w: World) -> object:
    group = Group("k-1", "gpu", {}, 1, nodes=("gpu-1",), provider_ids=("fake://gpu-1",))
    return await w.service.remember_launched(w.record(), _booking(groups=(group,)))


async def _confirm(w: World) -> object:
    req = w.record()
    assert req.booking is not None
    return await w.service.confirm(req, req.booking)


async def _retry(w: World) -> object:
    return await w.service.retry_or_fail(w.record(), attempt=1,
                                         reason=Reason.CAPACITY_IS_NOT_FOUND, detail="none free")


async def _fail(w: World) -> object:
    return await w.service.fail(w.record(), Reason.ACQUISITION_FAILED, "the cloud said no",
                                attempt=1)


class _Queue:
    """A cloud queue that holds every gang it is given (never grants)."""

    async def queued(self, pool: object, key: str) -> QueuedStatus | None:
        return None

    async def enqueue(self, request: object, seconds: int | None, *,
                      ready_within: float) -> QueuedStatus:
        return QueuedStatus(name="rr-1", state="ACCEPTED", since=rfc3339(NOW))


async def _queued_in_cloud(w: World) -> object:
    group = Group("k-1", "gpu", {}, 2)
    queues, is_queued = queued._queues, queued.is_queued
    # A stand-in pool and queue: the step reads neither beyond what _Queue answers and the
    # provider, parameters and registration budget it records the gang as queued through.
    pool = SimpleNamespace(spec=SimpleNamespace(provider="fake", parameters={"queue": True},
                                                registration_timeout_seconds=None))
    queued._queues = lambda svc, req, booking: [(pool, _Queue())]  # type: ignore[list-item]
    queued.is_queued = lambda svc, req: True
    try:
        return await queued.step(w.service, w.record(), _booking(groups=(group,)))
    finally:
        queued._queues, queued.is_queued = queues, is_queued


async def _waiting(w: World) -> object:
    return await queued.wait(w.service, w.record(), attempt=1, detail="none free")


def _deleted(phase: Phase) -> Callable[[], Body]:
    conditions = {
        Phase.FAILED: [_cond("Failed", "True", Reason.ACQUISITION_FAILED)],
        Phase.ENDED: [_cond("BookingExpired", "True", Reason.RESERVATION_TIME_EXPIRED)],
    }.get(phase)
    return lambda: _request(
        annotations={PHASE_ANNOTATION: phase} if phase is not Phase.NEW else {},
        conditions=conditions, deleting=True, finalizer=True,
    )


CASES = [
    Case("a request whose retry timer has not fired waits without a write",
         lambda: _request(annotations={"muster.dev/retry-at": rfc3339(NOW + timedelta(minutes=1))}),
         ((Phase.NEW, Event.BACKING_OFF),), Phase.NEW),
    Case("a request whose template may be late waits without a write",
         lambda: _request(template="late"), ((Phase.NEW, Event.AWAITING_OBJECTS),), Phase.NEW),
    Case("a woken request that still does not fit keeps its timer and condition",
         lambda: _request(template="huge",
                          annotations={"muster.dev/retry-at": rfc3339(NOW + timedelta(minutes=1))}),
         ((Phase.NEW, Event.STILL_NO_FIT),), Phase.NEW, woken=True),
    Case("a request that fits existing nodes is planned, then confirmed and booked",
         _request, ((Phase.NEW, Event.PLANNED), (Phase.ACQUIRING, Event.CONFIRMED)),
         Phase.BOOKED),
    Case("a new request with no fit yet retries after a backoff", _request,
         ((Phase.NEW, Event.RETRY),), Phase.NEW, drive=_retry),
    Case("a request whose template never came fails", lambda: _request(
        template="never", created=_LONG_AGO), ((Phase.NEW, Event.FAILED),), Phase.FAILED),
    Case("a queued-class request with no fit waits in Muster's own queue", _request,
         ((Phase.NEW, Event.WAITING),), Phase.NEW, drive=_waiting),
    Case("a queued-class gang out of stock at the cloud waits in Muster's own queue",
         _acquiring, ((Phase.ACQUIRING, Event.WAITING),), Phase.NEW, drive=_waiting),
    Case("a queued-class gang enqueued at the cloud says since when", _acquiring,
         ((Phase.ACQUIRING, Event.QUEUED),), Phase.ACQUIRING, drive=_queued_in_cloud),
    Case("a long acquisition is announced", _acquiring,
         ((Phase.ACQUIRING, Event.ANNOUNCED),), Phase.ACQUIRING, drive=_announce),
    Case("what the provider launched goes on the plan", _acquiring,
         ((Phase.ACQUIRING, Event.LAUNCHED),), Phase.ACQUIRING, drive=_launched),
    Case("an acquisition whose nodes are Ready is confirmed", _acquiring,
         ((Phase.ACQUIRING, Event.CONFIRMED),), Phase.BOOKED, drive=_confirm),
    Case("an acquisition whose plan annotation is unreadable retries", lambda: _request(
        annotations={PHASE_ANNOTATION: Phase.ACQUIRING, PLAN_ANNOTATION: "{not json"}),
         ((Phase.ACQUIRING, Event.RETRY),), Phase.NEW),
    Case("a failed acquisition fails the request", _acquiring,
         ((Phase.ACQUIRING, Event.FAILED),), Phase.FAILED, drive=_fail),
    Case("a booking whose Provisioned=True never landed is confirmed again", lambda: _request(
        annotations={PHASE_ANNOTATION: Phase.BOOKED,
                     PLAN_ANNOTATION: _booking().to_annotation()}),
         ((Phase.BOOKED, Event.CONFIRMED),), Phase.BOOKED),
    Case("a booking within its time holds, its phase annotation written once", lambda: _request(
        annotations={PHASE_ANNOTATION: Phase.ACQUIRING,
                     PLAN_ANNOTATION: _booking().to_annotation()},
        conditions=[_ACCEPTED, _PROVISIONED]),
         ((Phase.BOOKED, Event.HOLDING),), Phase.BOOKED),
    Case("a booking past its time ends, status first", lambda: _request(
        annotations={PHASE_ANNOTATION: Phase.BOOKED,
                     PLAN_ANNOTATION: _booking().to_annotation()},
        conditions=[_ACCEPTED, _cond("Provisioned", "True", Reason.CAPACITY_IS_FOUND,
                                     _LONG_AGO)]),
         ((Phase.BOOKED, Event.ENDED),), Phase.ENDED),
    Case("an ended booking whose phase annotation was cut short is repaired", lambda: _request(
        annotations={PHASE_ANNOTATION: Phase.BOOKED,
                     PLAN_ANNOTATION: _booking().to_annotation()},
        conditions=[_ACCEPTED, _PROVISIONED,
                    _cond("BookingExpired", "True", Reason.RESERVATION_TIME_EXPIRED)]),
         ((Phase.ENDED, Event.REPAIRED),), Phase.ENDED),
    Case("a failed request whose cleanup was cut short is repaired", lambda: _request(
        annotations={PHASE_ANNOTATION: Phase.ACQUIRING,
                     PLAN_ANNOTATION: _booking().to_annotation()},
        conditions=[_cond("Failed", "True", Reason.ACQUISITION_FAILED)]),
         ((Phase.FAILED, Event.REPAIRED),), Phase.FAILED),
    *(Case(f"a deleted request in phase {phase.value or 'new'} drops its finalizer",
           _deleted(phase), ((phase, Event.DELETED),), None)
      for phase in Phase),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_each_row_writes_what_the_table_says_and_ends_in_its_phase(
    make: Callable[[Body], World], case: Case
) -> None:
    w = make(case.body())
    if case.woken:
        w.service.wakeups = cast(Any, SimpleNamespace(claim=lambda key: True))
    await case.drive(w)
    assert [(r.phase, r.event) for r in w.taken] == list(case.rows)
    assert_writes(w.taken, w.kube.writes)
    if case.end is None:
        assert FINALIZER not in (w.kube.body["metadata"].get("finalizers") or [])
    else:
        assert RequestRecord.parse(w.kube.body).phase is case.end
        assert w.taken[-1].next is case.end


def test_every_row_of_the_table_has_a_case() -> None:
    driven = {row for case in CASES for row in case.rows}
    assert driven == {(r.phase, r.event) for r in TABLE}


async def test_a_transition_the_table_does_not_hold_stops_the_reconcile(
    make: Callable[[Body], World]
) -> None:
    w = make(_request(template="never", created=_LONG_AGO))
    w.service.table = [r for r in TABLE if (r.phase, r.event) != (Phase.NEW, Event.FAILED)]
    with pytest.raises(NotInTable, match="'failed' in phase 'new'"):
        await w.service.reconcile(KEY)
    assert w.kube.writes == []


def test_the_state_machine_page_shows_the_table() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "design"
            / "state-machine.md").read_text()
    assert lifecycle.markdown() in page, (
        "docs/design/state-machine.md must hold controller.lifecycle.markdown()'s table "
        "(python3 -c 'from controller.lifecycle import markdown; print(markdown())')"
    )


def test_the_phase_rule_lets_the_status_decide_an_outcome() -> None:
    for conditions, annotated, phase in [
        ([_cond("Failed", "True", "x")], Phase.BOOKED, Phase.FAILED),
        ([_cond("CapacityRevoked", "True", "x")], Phase.BOOKED, Phase.ENDED),
        ([_PROVISIONED], Phase.ACQUIRING, Phase.BOOKED),
        ([], Phase.ACQUIRING, Phase.ACQUIRING),
        ([], Phase.NEW, Phase.NEW),
    ]:
        assert lifecycle.phase_of(conditions, annotated) is phase
    assert lifecycle.annotated_phase({PHASE_ANNOTATION: "Bogus"}) is Phase.NEW
    assert re.fullmatch(r"[a-z ]+", Event.DELETED.value)
