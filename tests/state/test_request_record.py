"""A ProvisioningRequest is parsed once, on arrival: the record the cache holds is what the
service, the collector and the Kueue check read."""

from __future__ import annotations

import copy
from typing import Any

from controller.acquire.keys import groups_for
from controller.commands import objects
from controller.common.topology_defaults import DEFAULT_LEVELS
from controller.lifecycle import PHASE_ANNOTATION, PLAN_ANNOTATION, Phase
from controller.state.bookings import Booking
from controller.state.cache import ClusterState
from tests.cluster_objects import plan_on


def _booked(rv: str, plan_text: str) -> dict[str, Any]:
    body = objects.provisioning_request("g", pod_sets=[("w", 2)], namespace="ns")
    body["metadata"].update(uid="u-1", resourceVersion=rv, annotations={
        PHASE_ANNOTATION: Phase.ACQUIRING, PLAN_ANNOTATION: plan_text})
    return body


def test_a_status_only_event_keeps_the_parsed_booking() -> None:
    plan = plan_on(["n1"], new=1)
    booking = Booking(plan, attempt=1, groups=groups_for(plan, owner_uid="u-1", attempt=1))
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.upsert_request(_booked("1", booking.to_annotation()))
    first = state.objects.request("ns/g")
    assert first is not None and first.booking == booking
    again = _booked("2", booking.to_annotation())
    again["status"] = {"conditions": [{"type": "Provisioned", "status": "True"}]}
    state.upsert_request(again)
    second = state.objects.request("ns/g")
    assert second is not None and second.phase is Phase.BOOKED
    # Not decoded again: the snapshot's memoised plans hang on the Booking's identity.
    assert second.booking is first.booking and state.ledger.bookings()["ns/g"] is first.booking


def test_an_unreadable_plan_is_recorded_with_why_and_books_nothing() -> None:
    state = ClusterState(levels=DEFAULT_LEVELS)
    record = state.upsert_request(_booked("1", '{"plan": 1}'))
    assert record is not None and record.booking is None
    assert record.booking_error is not None and "muster.dev/plan" in record.booking_error
    assert state.ledger.bookings() == {}


def test_an_older_version_is_not_stored() -> None:
    state = ClusterState(levels=DEFAULT_LEVELS)
    newer = _booked("7", "")
    state.upsert_request(newer)
    older = copy.deepcopy(newer)
    older["metadata"]["resourceVersion"] = "6"
    older["metadata"]["annotations"][PHASE_ANNOTATION] = Phase.FAILED
    assert state.upsert_request(older) is None
    record = state.objects.request("ns/g")
    assert record is not None and record.annotated_phase is Phase.ACQUIRING
