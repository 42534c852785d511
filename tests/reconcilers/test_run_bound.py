"""When a provisioned run ends: maxRunDurationSeconds after Provisioned, or earlier where the
cloud that granted the gang takes the capacity back first (an AWS Capacity Block's end)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controller.reconcilers.queued import run_bound

BOOKED = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def test_the_run_duration_ends_the_run_when_the_cloud_ends_it_later() -> None:
    later = BOOKED + timedelta(hours=2)
    assert run_bound(BOOKED, 3600, later) == (BOOKED + timedelta(hours=1), False)
    assert run_bound(BOOKED, 3600, None) == (BOOKED + timedelta(hours=1), False)


def test_the_cloud_s_end_ends_the_run_when_it_comes_first() -> None:
    """A block bought for 24 h whose instances ran only from 20 min after its start: EC2
    takes them back before the 24 h from Provisioned are over, so Muster ends the run then
    and says the cloud did, rather than letting the nodes vanish under a live booking."""
    cloud = BOOKED + timedelta(hours=23, minutes=10)
    assert run_bound(BOOKED, 24 * 3600, cloud) == (cloud, True)
    assert run_bound(BOOKED, None, cloud) == (cloud, True)


def test_nothing_bounds_a_run_without_a_duration_or_a_cloud_end() -> None:
    assert run_bound(BOOKED, None, None) is None
    assert run_bound(None, 3600, BOOKED) is None
    assert run_bound(BOOKED, 10**12, None) is None  # past datetime's range: unbounded
