"""cluster-autoscaler's node estimate for pending pods (pod-by-pod strategy)."""

from __future__ import annotations

import pytest

from controller.simulate.autoscaler import bins_needed
from controller.simulate.engine import pods_for


@pytest.mark.parametrize(
    ("pending", "nodes"),
    [
        ({}, 0),
        ({1: 0}, 0),
        ({1: 9}, 2),
        ({8: 3, 4: 1, 2: 2}, 4),
        ({5: 2, 3: 2}, 2),  # 5+3 twice
        ({6: 1, 3: 2}, 2),  # 6 | 3+3
        ({7: 3, 2: 1}, 4),  # no 7-GPU node has room for 2
        ({3: 5}, 3),  # 3+3 | 3+3 | 3
    ],
)
def test_first_fit_decreasing(pending: dict[int, int], nodes: int) -> None:
    assert bins_needed(pending, 8) == nodes


@pytest.mark.parametrize(
    ("gpus", "pods"),
    [(1, (1, 1)), (4, (1, 4)), (8, (1, 8)), (12, (2, 8)), (16, (2, 8)), (32, (4, 8))],
)
def test_jobs_map_to_pods(gpus: int, pods: tuple[int, int]) -> None:
    assert pods_for(gpus, 8) == pods
