"""The crash harness's own parts: crash points kill where they are told to and nowhere
else, and each invariant check of :mod:`e2e.chaos` catches the violation it is about (a
harness whose checks cannot fail proves nothing)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from controller.common import crashpoints
from controller.kube import WatchEvent
from e2e.chaos import (
    Recorder,
    check_deletions,
    check_gangs_and_devices,
    check_outcomes,
    unbooked_nodes,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(env_value: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != crashpoints.ENV}
    if env_value is not None:
        env[crashpoints.ENV] = env_value
    code = ("from controller.common import crashpoints\n"
            "for _ in range(3):\n    crashpoints.reached('acquired')\n"
            "crashpoints.reached('mid-release')\nprint('survived')")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_crash_point_kills_the_process_at_its_nth_passage_only() -> None:
    done = _run("acquired:2")
    assert done.returncode == -signal.SIGKILL
    assert "crash point acquired:2 reached" in done.stdout
    assert "survived" not in done.stdout
    assert _run("acquired:4").stdout.strip() == "survived", "passed 3 times, never the 4th"
    assert _run(None).stdout.strip() == "survived"
    assert _run("mid-release:1").returncode == -signal.SIGKILL


def test_a_crash_point_name_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown step 'acquird'"):
        crashpoints.configure("acquird:1")
    crashpoints.configure(None)


# --------------------------------------------------------------------------- checks


def _request(name: str, rv: int, *, live: bool, groups: list[dict[str, Any]],
             assignments: list[dict[str, Any]], ended: bool = False) -> dict[str, Any]:
    conds = []
    if live or ended:
        conds.append({"type": "Provisioned", "status": "True", "reason": "CapacityIsProvisioned"})
    if ended:
        conds.append({"type": "BookingExpired", "status": "True",
                      "reason": "CapacityReservationTimeExpired"})
    plan = {"attempt": 1, "groups": groups,
            "plan": {"request": name, "mode": "provision", "cost": 0,
                     "assignments": assignments, "newNodes": [], "placements": []}}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "resourceVersion": str(rv),
                         "annotations": {"muster.dev/plan": json.dumps(plan),
                                         "muster.dev/phase": "Acquiring"}},
            "status": {"conditions": conds}}


def _node(name: str, rv: int, key: str, gpus: int = 8) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv),
                         "labels": {"muster.dev/acquisition-key": key,
                                    "muster.dev/owner-uid": "uid-a"}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


GROUP = {"key": "k1", "pool": "p", "domain": {"rack": "r1"}, "count": 2, "nodes": []}
SLOTS = [{"podSet": "w", "pods": 1, "node": None, "slot": ["p", {"rack": "r1"}, i],
          "domain": {}, "requests": {"nvidia.com/gpu": "8"}} for i in range(2)]


def _booked(rec: Recorder, *, nodes_rv: tuple[int, int] = (5, 6), live_rv: int = 10) -> None:
    rec.node_event(WatchEvent("ADDED", _node("n0", nodes_rv[0], "k1")))
    rec.node_event(WatchEvent("ADDED", _node("n1", nodes_rv[1], "k1")))
    rec.request_event(WatchEvent("ADDED", _request("a", 3, live=False, groups=[GROUP],
                                                   assignments=SLOTS)))
    rec.request_event(WatchEvent("MODIFIED", _request("a", live_rv, live=True, groups=[GROUP],
                                                      assignments=SLOTS)))


def test_a_node_deleted_under_a_live_booking_is_a_violation() -> None:
    rec = Recorder()
    _booked(rec)
    assert check_deletions(rec) == []
    rec.node_event(WatchEvent("DELETED", _node("n1", 12, "k1")))
    found = check_deletions(rec)
    assert len(found) == 1
    assert "n1 (key k1) deleted (rv 12..12) under the live booking of ns/a" in found[0]


def test_a_node_deleted_after_its_booking_ended_is_fine() -> None:
    rec = Recorder()
    _booked(rec)
    rec.request_event(WatchEvent("MODIFIED", _request(
        "a", 11, live=False, ended=True, groups=[GROUP], assignments=SLOTS)))
    rec.node_event(WatchEvent("DELETED", _node("n1", 12, "k1")))
    assert check_deletions(rec) == []


def test_a_node_found_gone_by_a_relist_counts_when_the_booking_was_live_throughout() -> None:
    rec = Recorder()
    _booked(rec)
    rec.node_sync([_node("n0", 5, "k1")], list_rv=20)
    assert check_deletions(rec) == [], "it may have gone before the booking was made"
    rec = Recorder()
    _booked(rec)
    rec.node_event(WatchEvent("MODIFIED", _node("n1", 12, "k1")))  # seen under the booking
    rec.node_sync([_node("n0", 5, "k1")], list_rv=20)
    assert any("n1" in v for v in check_deletions(rec))


def test_a_booking_a_relist_finds_ended_or_gone_may_have_ended_at_any_missed_version() -> None:
    # The CI subset across an API server restart: BookingExpired written (rv 11, missed by the
    # harness's watch, which was down), the nodes released (rv 12), the phase annotation
    # written (rv 13); the re-list showed only rv 13. Not a deletion under a live booking.
    ended = _request("a", 13, live=False, ended=True, groups=[GROUP], assignments=SLOTS)
    for relist in ([ended], []):
        rec = Recorder()
        _booked(rec)
        rec.node_event(WatchEvent("DELETED", _node("n1", 12, "k1")))
        rec.request_sync(relist, list_rv=14)
        assert check_deletions(rec) == [], relist
    # A booking the re-list still shows live was live all along: a deletion under it counts.
    rec = Recorder()
    _booked(rec)
    rec.node_event(WatchEvent("DELETED", _node("n1", 12, "k1")))
    rec.request_sync([_request("a", 10, live=True, groups=[GROUP], assignments=SLOTS)],
                     list_rv=14)
    assert len(check_deletions(rec)) == 1
    # A deletion seen before the booking's last seen version still counts after a re-list.
    rec = Recorder()
    _booked(rec, live_rv=10)
    rec.node_event(WatchEvent("DELETED", _node("n1", 12, "k1")))
    rec.request_event(WatchEvent("MODIFIED", _request("a", 13, live=True, groups=[GROUP],
                                                      assignments=SLOTS)))
    rec.request_sync([], list_rv=20)
    assert len(check_deletions(rec)) == 1


def test_provisioned_before_every_node_existed_is_a_partial_gang() -> None:
    rec = Recorder()
    _booked(rec, nodes_rv=(5, 14), live_rv=10)
    found = check_gangs_and_devices(rec)
    assert any("with 1 of 2 node(s) of group k1" in v for v in found), found


def test_two_live_bookings_on_the_same_gpus_are_a_double_booking() -> None:
    rec = Recorder()
    _booked(rec)
    assert check_gangs_and_devices(rec) == []
    other = [{"podSet": "w", "pods": 1, "node": "n0", "slot": None, "domain": {},
              "requests": {"nvidia.com/gpu": "4"}}]
    rec.request_event(WatchEvent("ADDED", _request("b", 15, live=True, groups=[],
                                                   assignments=other)))
    found = check_gangs_and_devices(rec)
    assert any("node n0: 12 GPUs booked of 8" in v for v in found), found


def test_more_nodes_under_a_key_than_planned_is_a_violation() -> None:
    rec = Recorder()
    _booked(rec)
    rec.node_event(WatchEvent("ADDED", _node("n2", 7, "k1")))
    assert any("k1: 3 nodes, planned 2" in v for v in check_gangs_and_devices(rec))


def test_requests_without_an_outcome_and_nodes_without_a_booking_are_found() -> None:
    rec = Recorder()
    _booked(rec)
    assert check_outcomes(rec, 4) == [] and unbooked_nodes(rec) == []
    stuck = _request("c", 16, live=False, groups=[], assignments=[])
    stuck["metadata"]["annotations"] = {}
    rec.request_event(WatchEvent("ADDED", stuck))
    assert check_outcomes(rec, 4) == ["ns/c: no outcome (conditions [], attempt 0)"]
    rec.request_event(WatchEvent("MODIFIED", _request(
        "a", 17, live=False, ended=True, groups=[GROUP], assignments=SLOTS)))
    body = rec.current["ns/a"]
    body["metadata"]["annotations"]["muster.dev/phase"] = "Ended"
    assert unbooked_nodes(rec) == ["n0", "n1"]


def test_refusals_right_after_an_api_server_restart_are_not_missing_grants(tmp_path: Any) -> None:
    """A restarted kube-apiserver answers 403 until its RBAC caches synced (seen on the real
    tier after the crash harness's restarts); the audit check must not call that a gap."""
    from e2e.rbac_audit import MUSTER_USER, read

    def event(stamp: str) -> str:
        return json.dumps({
            "user": {"username": MUSTER_USER}, "userAgent": "muster/0.1.0",
            "objectRef": {"resource": "nodes", "apiGroup": ""}, "verb": "list",
            "annotations": {"authorization.k8s.io/decision": "forbid"},
            "responseStatus": {"code": 403}, "requestReceivedTimestamp": stamp})

    log = tmp_path / "audit.log"
    log.write_text(event("2026-11-30T21:58:01.042396Z") + "\n")
    restart = 1796075870.0  # 2026-11-30T21:57:50Z
    assert read(log).refused, "without a restart it is a refusal"
    assert not read(log, restarts=[restart], grace=90).refused
    assert read(log, restarts=[restart - 600], grace=90).refused
