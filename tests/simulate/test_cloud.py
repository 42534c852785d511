"""The simulated cloud: stock per rack, quota, atomic versus non-atomic acquisition, refill."""

from __future__ import annotations

import pytest

from controller.simulate.cloud import Cloud, CloudConfig


def cloud(**kw: object) -> Cloud:
    base: dict[str, object] = {
        "blocks": 1,
        "racks_per_block": 2,
        "nodes_per_rack": 8,
        "initial_stock": (4, 3),
        "quota_gpus": 1024,
        "refill_prob": 0.0,
        "drain_prob": 0.0,
    }
    base.update(kw)
    return Cloud(CloudConfig(**base), seed=0)  # type: ignore[arg-type]


def test_non_atomic_request_gets_what_is_in_stock() -> None:
    c = cloud()
    granted = c.acquire_any(12)
    assert len(granted) == 7
    assert sorted(r for r, _ in granted) == [0, 0, 0, 0, 1, 1, 1]
    assert c.stock == [0, 0]
    assert c.acquire_any(1) == []


def test_non_atomic_request_is_capped_by_the_quota() -> None:
    c = cloud(quota_gpus=40)  # 5 nodes
    assert len(c.acquire_any(12)) == 5
    assert c.quota_room_nodes() == 0


def test_atomic_request_gets_everything_or_nothing() -> None:
    c = cloud()
    assert c.acquire_atomic([(0, 3), (1, 4)]) is None  # rack 1 has only 3
    assert c.stock == [4, 3] and c.held_nodes == 0
    granted = c.acquire_atomic([(0, 4), (1, 2)])
    assert granted is not None and len(granted) == 6
    assert c.stock == [0, 1]


def test_atomic_request_respects_the_quota() -> None:
    c = cloud(quota_gpus=32)
    assert c.acquire_atomic([(0, 4), (1, 1)]) is None
    assert c.acquire_atomic([(0, 4)]) is not None


def test_boot_latency_is_drawn_in_the_configured_range() -> None:
    c = cloud(initial_stock=(8, 8), boot_min_s=90.0, boot_max_s=120.0)
    latencies = [boot for _, boot in c.acquire_any(16)]
    assert all(90.0 <= b <= 120.0 for b in latencies)
    assert len(set(latencies)) > 1


def test_released_nodes_return_to_stock_and_refill_is_bounded_by_the_rack() -> None:
    c = cloud(initial_stock=(6, 8), refill_prob=1.0)
    c.acquire_atomic([(0, 6)])
    c.release(0)
    assert c.stock == [1, 8] and c.held_nodes == 5
    assert c.tick() is True  # other tenants free one node in rack 0; rack 1 is full already
    assert c.stock == [2, 8]
    assert c.tick() is True
    assert c.stock == [3, 8]
    assert c.ours[0] + c.others[0] + c.stock[0] == 8
    with pytest.raises(RuntimeError):
        c.release(1)


def test_other_tenants_drain_stock_reproducibly() -> None:
    a = cloud(initial_stock=None, refill_prob=0.4, drain_prob=0.4)
    b = cloud(initial_stock=None, refill_prob=0.4, drain_prob=0.4)
    history_a, history_b = [], []
    for _ in range(50):
        a.tick()
        b.tick()
        history_a.append(tuple(a.stock))
        history_b.append(tuple(b.stock))
    assert history_a == history_b
    assert len(set(history_a)) > 1


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("quota_gpus", -8, "quota"),
        ("boot_min_s", 200.0, "boot latency"),
        ("initial_stock", (1,), "initial stock needs 2 values"),
        ("refill_prob", 1.5, "refill probability"),
    ],
)
def test_nonsense_settings_are_rejected_with_the_setting_named(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        cloud(**{field: value})
