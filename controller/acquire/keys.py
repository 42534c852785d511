"""Idempotency keys and acquisition groups for a plan. Pure.

The one key scheme of Muster: every provider call (and the provider contract tests) uses a
key made here. A key is deterministic in (request uid, attempt, group index) and persisted in
the request's plan before any provider call: a controller that restarts mid-acquisition
calls the provider with the same key and gets the same nodes back instead of launching a
second set, and an earlier attempt's keys are recognisably stale. Providers derive their
cloud tokens and resource names from it (:mod:`providers.naming`) and tag what they create
with it, so the collector can tell whose nodes they are.
"""

from __future__ import annotations

from controller.fit.types import Plan
from controller.state.bookings import Group

_UID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


def acquisition_key(owner_uid: str, attempt: int, group: int) -> str:
    """``<uid>-<attempt>-<group>``: a valid label value, AWS tag value and GCP label value
    (<= 63 characters of ``[a-z0-9-]``, alphanumeric at both ends)."""
    uid = "".join(ch for ch in owner_uid.lower() if ch in _UID_CHARS).strip("-")[:48]
    if not uid:
        raise ValueError(f"owner uid {owner_uid!r} has no letter or digit")
    if not 0 <= attempt < 10**6 or not 0 <= group < 10**6:
        raise ValueError(f"attempt {attempt} and group {group} must be in [0, 10**6)")
    return f"{uid}-{attempt}-{group}"


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
