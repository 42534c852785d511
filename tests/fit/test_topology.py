"""The "fewest domains, last one tightest" choice the descent is built on."""

from __future__ import annotations

import pytest

from controller.fit.topology import HOSTNAME, Levels, choose


@pytest.mark.parametrize(
    ("groups", "need", "expected"),
    [
        pytest.param([("a", 4, 1), ("b", 2, 1), ("c", 3, 1)], 2, [("b", 2, 1)],
                     id="tightest-single"),
        pytest.param([("a", 4, 1), ("b", 2, 1), ("c", 3, 1)], 6, [("a", 4, 1), ("b", 2, 1)],
                     id="largest-then-tightest-rest"),
        pytest.param([("b", 3, 1), ("a", 3, 1)], 3, [("a", 3, 1)], id="tie-by-name"),
        pytest.param([("n", 2, 5)], 7, [("n", 2, 3), ("n", 1, 1)], id="units-of-a-class"),
        pytest.param([("big", 8, 2), ("small", 1, 4)], 17, [("big", 8, 2), ("small", 1, 1)],
                     id="whole-units-then-best-fit"),
    ],
)
def test_choose(groups: list[tuple[str, int, int]], need: int,
                expected: list[tuple[str, int, int]]) -> None:
    assert choose(groups, need, sort_key=str) == expected


def test_choose_without_capacity_is_an_error() -> None:
    with pytest.raises(ValueError, match="not enough capacity"):
        choose([("a", 1, 1)], 2, sort_key=str)


def test_hostname_is_the_node_level() -> None:
    levels = Levels.of(("block", "rack", HOSTNAME))
    assert levels.domain == ("block", "rack")
    assert levels.index(HOSTNAME) == 2
    assert levels.path({"block": "b", HOSTNAME: "h"}) == ("b",)  # ends at the lowest level it has
    assert Levels.of(("block", "rack")).node_level is None
