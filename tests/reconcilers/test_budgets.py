"""Budgets refuse plans before anything is booked or bought."""

from __future__ import annotations

from typing import Any, cast

import pytest

from controller.config import MusterConfig
from controller.reconcilers.provisioning.service import ProvisioningService
from controller.state.bookings import Booking
from controller.state.planner import Refusal
from controller.state.requests import RequestRecord
from tests.cluster_objects import plan_on


def _service(**budgets: Any) -> ProvisioningService:
    # book() reads only the config; the other collaborators are never touched.
    none = cast(Any, None)
    return ProvisioningService(kube=none, state=none, planner=none, providers=none,
                               config=MusterConfig(budgets=budgets), clock=none)


REQ = RequestRecord.parse({"metadata": {"name": "g", "namespace": "ns", "uid": "u-1"}})


@pytest.mark.parametrize(
    ("budgets", "new", "refused"),
    [
        pytest.param({}, 8, None, id="no-budget"),
        pytest.param({"max_new_nodes_per_request": 8}, 8, None, id="at-the-node-limit"),
        pytest.param({"max_new_nodes_per_request": 4}, 8, "8 new nodes", id="too-many-nodes"),
        pytest.param({"max_cost_per_hour_per_request": 5.0}, 4, "cost 6.00/h", id="too-dear"),
    ],
)
def test_budget(budgets: dict[str, Any], new: int, refused: str | None) -> None:
    result = _service(**budgets).book(REQ, plan_on([], new=new), attempt=1)
    if refused is None:
        assert isinstance(result, Booking)
        assert [g.count for g in result.groups] == [new]
    else:
        assert isinstance(result, Refusal) and not result.wait and refused in result.text
