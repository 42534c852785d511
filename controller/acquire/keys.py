"""Idempotency keys and acquisition groups for a plan. Pure.

A key is deterministic in (request uid, attempt, group index): a controller that restarts
mid-acquisition calls the provider with the same key and gets the same nodes back instead of
launching a second set, and an earlier attempt's keys are recognisably stale.
"""

from __future__ import annotations

from controller.fit.types import Plan
from controller.state.bookings import Group


def acquisition_key(owner_uid: str, attempt: int, group: int) -> str:
    """``<uid>-<attempt>-<group>``: a valid label value (<= 63 chars, alphanumeric ends)."""
    uid = "".join(ch for ch in owner_uid.lower() if ch.isalnum() or ch == "-").strip("-")
    return f"{uid[:48] or 'x'}-{attempt}-{group}"


def groups_for(plan: Plan, *, owner_uid: str, attempt: int) -> tuple[Group, ...]:
    """One group per NewNodes entry of the plan, keyed for this attempt."""
    return tuple(
        Group(
            key=acquisition_key(owner_uid, attempt, i),
            pool=nn.pool,
            domain=dict(nn.domain),
            count=nn.count,
        )
        for i, nn in enumerate(plan.new_nodes)
    )
