"""CEL selectors: the expressions DRA uses, Kubernetes' quantity and semver functions, and
errors that name the object an expression came from."""

from __future__ import annotations

import pytest

from controller.fit.cel import (
    SelectorError,
    SemVer,
    compile_selector,
    device_value,
    quantity_milli,
    referenced_names,
)

GPU = device_value(
    "gpu.nvidia.com",
    {"gpu.nvidia.com/productName": "NVIDIA H100 80GB HBM3", "gpu.nvidia.com/index": 3,
     "gpu.nvidia.com/driverVersion": SemVer.parse("550.54.15"),
     "resource.kubernetes.io/pcieRoot": "pci0000:10"},
    {"gpu.nvidia.com/memory": 80 * 2**30},
    False,
)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('device.driver == "gpu.nvidia.com"', True),
        ('device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"', True),
        ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0', True),
        ('device.capacity["gpu.nvidia.com"].memory == quantity("80Gi")', True),
        ('device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("81920Mi"))', False),
        ('device.capacity["gpu.nvidia.com"].memory.asInteger() == 85899345920', True),
        ('quantity("500m").add(quantity("1.5")).compareTo(quantity("2")) == 0', True),
        ('"productName" in device.attributes["gpu.nvidia.com"]', True),
        ('"x" in device.attributes["other.example.com"]', False),
        ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:10"', True),
        ('device.attributes["gpu.nvidia.com"].index > 2 && device.driver == "x"', False),
        ('device.attributes["gpu.nvidia.com"].index > 5 || device.driver != "x"', True),
        ('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("1.2.0"))',
         True),
        ('device.attributes["gpu.nvidia.com"].driverVersion.major() == 550', True),
        ('semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))', True),
        ('semver("1.0.0-alpha.10").isGreaterThan(semver("1.0.0-alpha.9"))', True),
        ('isQuantity("1Gi") && !isQuantity("one") && isSemver("1.2.3")', True),
        # Parsed as Kubernetes parses them: nothing around the value, ASCII digits only.
        ('isQuantity("1Gi ") || isQuantity(" 1") || isQuantity("\\uff11")', False),
        ('isSemver(" 1.2.3") || isSemver("1.2.3 ") || isSemver("\\uff11.2.3")', False),
        ('cel.bind(a, device.attributes["gpu.nvidia.com"], a.index == 3)', True),
        ('device.allowMultipleAllocations', False),
    ],
)
def test_dra_expressions(expression: str, expected: bool) -> None:
    assert compile_selector(expression, "DeviceClass test").matches(GPU) is expected


@pytest.mark.parametrize(
    ("expression", "needle"),
    [
        ("device.driver ==", "does not compile"),
        ('device.attributes["gpu.nvidia.com"].missing == 1', "evaluation failed"),
        ('device.capacity["gpu.nvidia.com"].memory > 5', "evaluation failed"),
        ('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(quantity("1"))',
         "compareTo needs a semver, got quantity"),
        ('quantity("lots").sign() == 1', "invalid quantity"),
        ("device.driver", "must evaluate to a bool"),
        ("   ", "empty expression"),
    ],
)
def test_errors_name_the_object_and_the_expression(expression: str, needle: str) -> None:
    with pytest.raises(SelectorError) as err:
        compile_selector(expression, "DeviceClass broken").matches(GPU)
    message = str(err.value)
    assert message.startswith("DeviceClass broken: CEL selector ")
    assert repr(expression) in message
    assert needle in message


def test_expressions_compile_once() -> None:
    a = compile_selector('device.driver == "a"', "DeviceClass a")
    assert compile_selector('device.driver == "a"', "DeviceClass a") is a
    assert compile_selector('device.driver == "a"', "DeviceClass b").program is a.program


def test_quantities_and_versions() -> None:
    assert quantity_milli("1.5") == 1500
    assert quantity_milli("2Ki") == 2048_000
    assert quantity_milli("1e3") == 1_000_000
    with pytest.raises(ValueError):
        quantity_milli("1.5.5")
    assert SemVer.parse("1.2.3-rc.1+build.5") == SemVer(1, 2, 3, ("rc", "1"))
    assert SemVer.parse("1.10.0").compare(SemVer.parse("1.9.9")) == 1
    with pytest.raises(ValueError):
        SemVer.parse("01.2.3")


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ('device.attributes["gpu.nvidia.com"].productName == "H100"',
         {"productName", "H100", "gpu.nvidia.com"}),
        ('"uuid" in device.attributes["gpu.nvidia.com"]', {"uuid"}),
        ('device.attributes["d"]["uuid"] == "x"', {"uuid"}),
        ('device.attributes["d"].exists(k, k == "a")', None),
        ('device.attributes["d"][k] == 1', None),
        ('cel.bind(a, device.attributes["d"], a.uuid == "x")', None),
        ("size(device.attributes) > 0", None),
    ],
)
def test_referenced_names(expression: str, names: set[str] | None) -> None:
    got = referenced_names(expression)
    if names is None:
        assert got is None
    else:
        assert got is not None and names <= got
