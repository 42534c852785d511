"""GCP specific reservations and their blocks as pools, against the Compute REST fake (the
google-cloud-compute REST transport serialises every request from its proto types)."""

from __future__ import annotations

import pytest

from controller.acquire.keys import acquisition_key
from providers.base import AcquireRequest, CapacityUnavailable, ProviderConfigError
from providers.gcp import RESERVATION_NAME_KEY, parse_parameters
from tests.providers.conftest import GCP_ZONE, ZONE_LABEL, GcpFake, gcp_parameters, make_pool


def req(gcp: GcpFake, uid: str, count: int, **reservation: object) -> AcquireRequest:
    pool = gcp.pool(reservation=reservation)
    return AcquireRequest(key=acquisition_key(uid, 0, 0), pool=pool, count=count,
                          domain={ZONE_LABEL: GCP_ZONE}, owner=f"ml/{uid}", owner_uid=uid)


async def test_a_gang_is_placed_into_a_reservation_s_block(gcp_fake: GcpFake) -> None:
    gcp_fake.fake.add_reservation(GCP_ZONE, "h100-res", 16, blocks={"b1": 4, "b2": 12})
    provider = gcp_fake.provider()
    r = req(gcp_fake, "uid-a", 8, name="h100-res", block="b2")
    nodes = await provider.acquire(r)

    props = gcp_fake.fake.calls("bulk_insert")[0].body["instanceProperties"]
    assert props["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": RESERVATION_NAME_KEY,
        "values": ["h100-res/reservationBlocks/b2"],
    }
    assert len(nodes) == 8
    assert gcp_fake.fake.in_use(GCP_ZONE, "h100-res", "b2") == 8
    [block] = await provider.reservations(r.pool)
    assert (block.id, block.reserved, block.used, block.free) == (
        "h100-res/reservationBlocks/b2", 12, 8, 4)
    [whole] = await provider.reservations(gcp_fake.pool(reservation={"name": "h100-res"}))
    assert (whole.reserved, whole.used, whole.free, whole.state) == (16, 8, 8, "READY")


async def test_a_reservation_too_small_for_the_gang_is_not_used_partially(
    gcp_fake: GcpFake,
) -> None:
    gcp_fake.fake.add_reservation(GCP_ZONE, "h100-res", 16, blocks={"b1": 4, "b2": 12})
    provider = gcp_fake.provider()
    with pytest.raises(CapacityUnavailable):
        await provider.acquire(req(gcp_fake, "uid-b", 5, name="h100-res", block="b1"))
    assert gcp_fake.fake.all_instances() == []
    assert gcp_fake.fake.in_use(GCP_ZONE, "h100-res") == 0


async def test_released_vms_give_their_reservation_back(gcp_fake: GcpFake) -> None:
    gcp_fake.fake.add_reservation(GCP_ZONE, "h100-res", 4)
    provider = gcp_fake.provider()
    r = req(gcp_fake, "uid-c", 4, name="h100-res")
    await provider.acquire(r)
    assert (await provider.reservations(r.pool))[0].free == 0
    await provider.release(r.pool, r.key)
    assert (await provider.reservations(r.pool))[0].free == 4


async def test_an_unknown_reservation_is_not_read_as_stock_out(gcp_fake: GcpFake) -> None:
    provider = gcp_fake.provider()
    r = req(gcp_fake, "uid-d", 2, name="nowhere")
    with pytest.raises(ProviderConfigError, match="RESOURCE_NOT_FOUND"):
        await provider.acquire(r)
    assert gcp_fake.fake.all_instances() == []
    with pytest.raises(ProviderConfigError):
        await provider.reservations(r.pool)


def test_a_shared_reservation_is_named_by_its_path() -> None:
    pool = make_pool("gcp", gcp_parameters(
        reservation={"name": "projects/other-project/reservations/shared-res"}))
    reservation = parse_parameters(pool).reservation
    assert reservation is not None
    assert reservation.affinity() == (
        "SPECIFIC_RESERVATION", RESERVATION_NAME_KEY,
        ["projects/other-project/reservations/shared-res"])


@pytest.mark.parametrize("value", [
    {"block": "b1"},
    {"name": "res", "key": "k", "values": ["v"]},
    {"name": "res", "consume": "ANY_RESERVATION"},
    {"name": "Res_1"},
    {"name": "res", "block": "B 1"},
])
def test_bad_reservation_parameters_name_the_field(value: dict[str, object]) -> None:
    pool = make_pool("gcp", gcp_parameters(reservation=value))
    with pytest.raises(ProviderConfigError, match=r"spec\.parameters\.reservation"):
        parse_parameters(pool)
