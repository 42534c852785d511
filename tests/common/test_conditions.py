"""metav1.Condition semantics of the conditions Muster writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controller.common.conditions import ConditionType, Reason, message, set_condition

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_transition_time_moves_only_when_the_status_flips() -> None:
    conds = set_condition([], type_=ConditionType.PROVISIONED, status=False,
                          reason=Reason.PROVISIONING, message="a", now=T0, generation=1)
    later = set_condition(conds, type_=ConditionType.PROVISIONED, status=False,
                          reason=Reason.CAPACITY_IS_NOT_FOUND, message="b",
                          now=T0 + timedelta(seconds=30), generation=1)
    assert later[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert later[0]["reason"] == "CapacityIsNotFound"
    flipped = set_condition(later, type_=ConditionType.PROVISIONED, status=True,
                            reason=Reason.CAPACITY_IS_FOUND, message="c",
                            now=T0 + timedelta(seconds=60), generation=2)
    assert flipped[0]["lastTransitionTime"] == "2026-01-01T00:01:00Z"
    assert flipped[0]["observedGeneration"] == 2


def test_other_conditions_are_kept() -> None:
    conds = set_condition([{"type": "Accepted", "status": "True"}],
                          type_=ConditionType.FAILED, status=True, reason=Reason.NEVER_FITS,
                          message="m", now=T0, generation=None)
    assert [c["type"] for c in conds] == ["Accepted", "Failed"]
    assert "observedGeneration" not in conds[1]


def test_messages_give_cause_and_fix() -> None:
    text = message(Reason.NEVER_FITS, detail="pod set w needs 40 pods within one rack")
    assert "40 pods" in text and "CapacityPool" in text
