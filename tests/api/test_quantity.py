"""Kubernetes quantities to engine integers."""

from __future__ import annotations

import pytest

from controller.api.quantity import to_resources, to_units


@pytest.mark.parametrize(
    ("resource", "value", "expected"),
    [
        pytest.param("cpu", "500m", 500, id="millicores"),
        pytest.param("cpu", "1.5", 1500, id="fractional-cores"),
        pytest.param("cpu", 2, 2000, id="int-cores"),
        pytest.param("cpu", "1e3", 1_000_000, id="exponent"),
        pytest.param("cpu", "100n", 1, id="nanocores-round-up"),
        pytest.param("cpu", "0.0001", 1, id="tiny-cpu-round-up"),
        pytest.param("memory", "2Gi", 2 * 2**30, id="binary-suffix"),
        pytest.param("memory", "128974848", 128974848, id="plain-bytes"),
        pytest.param("memory", "129M", 129_000_000, id="decimal-suffix"),
        pytest.param("memory", "1.5Ki", 1536, id="fractional-binary"),
        pytest.param("memory", "0.5", 1, id="half-byte-rounds-up"),
        pytest.param("nvidia.com/gpu", "8", 8, id="extended-resource"),
        pytest.param("ephemeral-storage", "1E", 10**18, id="exa"),
    ],
)
def test_to_units(resource: str, value: str | int, expected: int) -> None:
    assert to_units(resource, value) == expected


# The API server's ParseQuantity refuses whitespace around a quantity and non-ASCII digits.
@pytest.mark.parametrize("bad", ["abc", "1.2.3", "", "5Xi", "Gi", "1 Gi", "--1", "1Gi ", " 1",
                                 "1\n", "\uff11Gi", "\u0661", "1e\uff13"])
def test_bad_quantity_names_the_value(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        to_units("memory", bad)


def test_negative_rejected() -> None:
    with pytest.raises(ValueError, match="negative quantity '-1' for cpu"):
        to_units("cpu", "-1")


def test_resource_list_error_names_the_resource() -> None:
    with pytest.raises(ValueError, match=r"^memory: invalid quantity"):
        to_resources({"cpu": "1", "memory": "lots"})
