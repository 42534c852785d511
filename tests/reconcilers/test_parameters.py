"""A request's parameters: what Muster honours, what it ignores (saying so), what it refuses.

Kueue copies any ProvisioningRequestConfig parameter and any ``provreq.kueue.x-k8s.io/<name>``
annotation into the request unchecked, so a name Muster does not know never fails a request
(see controller/api/parameters.py; the real-Kueue test is in e2e/test_kueue_real.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import pytest

from controller.api.parameters import read_parameters
from controller.commands import objects
from controller.common.clock import ManualClock
from controller.common.topology_defaults import KUEUE_REQUIRED, KUEUE_UNCONSTRAINED
from controller.fit.types import Mode
from controller.kube import KubeClient
from controller.kube.resources import EVENTS, POD_TEMPLATES, PROVISIONING_REQUESTS
from controller.operator import Controller
from providers.fake import FakeProvider
from tests.cluster_objects import starve
from tests.helpers import eventually

ATOMIC = "atomic-provisioning.muster.dev"
CHECK = "check-capacity.muster.dev"
_until = functools.partial(eventually, within=10.0, step=0.02)


# ----------------------------------------------------------------------------- pure


def test_names_muster_does_not_act_on_are_ignored_with_the_reason() -> None:
    params = read_parameters(
        {"maxRunDurationSeconds": "3600", "colour": "blue", "processorInstance": "a",
         "ValidUntilSeconds": "60", "noRetry": "false"}, Mode.PROVISION, ATOMIC)
    assert not params.problems
    assert params.values.valid_until_seconds == 60 and params.values.no_retry is False
    assert set(params.ignored) == {"colour", "processorInstance"}
    # GKE's and Kueue's run bound is read (no longer ignored): Muster ends the run then.
    assert params.values.max_run_duration_seconds == 3600
    assert params.ignored["colour"] == f"not a parameter of {ATOMIC}"
    assert "atomic requests are served whatever it says" in params.ignored["processorInstance"]
    assert params.note().startswith("Muster ignores parameter(s) colour (")
    assert "colour, processorInstance" in params.short_note()


def test_check_capacity_honours_its_processor_instance() -> None:
    params = read_parameters({"processorInstance": "a", "noRetry": "TRUE"}, Mode.CHECK, CHECK)
    assert not params.ignored and not params.problems and params.values.no_retry


def test_a_misspelt_name_is_ignored_with_a_suggestion() -> None:
    params = read_parameters({"noretry": "true"}, Mode.PROVISION, ATOMIC)
    assert params.values.no_retry is False
    assert params.ignored["noretry"].endswith("did you mean noRetry?")


@pytest.mark.parametrize(("params", "words"), [
    ({"noRetry": "maybe"}, "noRetry must be true or false, got 'maybe'"),
    ({"ValidUntilSeconds": "soon"}, "ValidUntilSeconds must be a whole number"),
    ({"ValidUntilSeconds": "-5"}, "ValidUntilSeconds must be a whole number"),
])
def test_an_unreadable_value_of_an_honoured_parameter_is_a_problem(
    params: dict[str, str], words: str
) -> None:
    got = read_parameters(params, Mode.PROVISION, ATOMIC)
    assert any(words in p for p in got.problems), got.problems


def test_no_parameters_no_note() -> None:
    params = read_parameters({}, Mode.PROVISION, ATOMIC)
    assert params.note() == "" and params.short_note() == ""


# ----------------------------------------------------------------------------- controller


async def _condition(kube: KubeClient, name: str, type_: str) -> dict[str, Any] | None:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return next((c for c in (pr.get("status") or {}).get("conditions") or []
                 if c["type"] == type_), None)


async def _true(kube: KubeClient, name: str, type_: str) -> dict[str, Any] | None:
    cond = await _condition(kube, name, type_)
    return cond if cond is not None and cond["status"] == "True" else None


async def _create(kube: KubeClient, name: str, parameters: dict[str, str],
                  class_name: str = ATOMIC) -> None:
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        name, namespace="ns", pod_sets=[("workers", 2)], class_name=class_name,
        parameters=parameters), namespace="ns")


def _acquires(provider: FakeProvider) -> int:
    return sum(1 for c in provider.calls if c.op == "acquire")


async def test_ignored_parameters_are_reported_and_the_gang_is_provisioned(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, _, _ = running
    await _create(kube, "kueue", {"maxRunDurationSeconds": "3600", "colour": "blue",
                                  "ValidUntilSeconds": "600"})
    provisioned = await _until(lambda: _true(kube, "kueue", "Provisioned"))
    assert provisioned["reason"] == "CapacityIsProvisioned"
    # Kueue copies the Provisioned message into the Workload's admission check.
    assert "Ignored parameter(s): colour (" in provisioned["message"]
    assert "maxRunDurationSeconds" not in provisioned["message"]
    accepted = await _true(kube, "kueue", "Accepted")
    assert accepted is not None and accepted["reason"] == "Accepted"
    assert "Muster ignores parameter(s) colour (not a parameter of" in accepted["message"]
    assert "maxRunDurationSeconds" not in accepted["message"]
    assert await _condition(kube, "kueue", "Failed") is None

    async def warned() -> list[dict[str, Any]]:
        await controller.events.flush()
        items = (await kube.list(EVENTS, namespace="ns")).get("items") or []
        return [e for e in items if e["involvedObject"]["name"] == "kueue"
                and e["reason"] == "ParametersIgnored"]

    (event,) = await _until(warned)
    assert event["type"] == "Warning" and "colour" in event["message"]


async def test_no_retry_fails_an_atomic_request_on_its_first_stock_out(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    _, _, provider = running
    starve(provider)
    await _create(kube, "once", {"noRetry": "true"})
    failed = await _until(lambda: _true(kube, "once", "Failed"))
    assert failed["reason"] == "AcquisitionFailed"
    assert "noRetry is set, so Muster does not retry" in failed["message"]
    await asyncio.sleep(0.1)
    assert _acquires(provider) == 1


async def test_valid_until_seconds_stops_retrying_that_long_after_creation(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, clock, provider = running
    starve(provider)
    # Backoff 10 s then 20 s (the defaults): attempt 2 starts 10 s after creation, attempt 3
    # would start 30 s after it, past the 15 s the request allows.
    await _create(kube, "deadline", {"ValidUntilSeconds": "15"})

    async def attempted() -> bool:
        return _acquires(provider) >= 1

    await _until(attempted)
    await asyncio.sleep(0.05)
    await clock.advance(controller.config.retry.backoff(1))
    failed = await _until(lambda: _true(kube, "deadline", "Failed"))
    assert failed["reason"] == "RetriesExhausted"
    assert "within ValidUntilSeconds=15 of the request's creation (2 attempt(s)" in (
        failed["message"])
    assert _acquires(provider) == 2


@pytest.mark.parametrize(("parameters", "words"), [
    ({"noRetry": "maybe"}, "noRetry must be true or false, got 'maybe'"),
    # Values the admission policy refuses; requests Kueue creates are exempt from it.
    ({"ValidUntilSeconds": "\uff16\uff10"}, "ValidUntilSeconds must be a whole number of "
     "seconds >= 0, got '\uff16\uff10'"),
    ({"ValidUntilSeconds": "+60"}, "ValidUntilSeconds must be a whole number"),
    ({"ValidUntilSeconds": "6_0"}, "ValidUntilSeconds must be a whole number"),
    ({"noRetry": "true\x1c"}, "noRetry must be true or false"),
])
async def test_an_unreadable_value_fails_the_request_naming_it(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider],
    parameters: dict[str, str], words: str,
) -> None:
    _, _, provider = running
    await _create(kube, "maybe", parameters)
    failed = await _until(lambda: _true(kube, "maybe", "Failed"))
    assert failed["reason"] == "InvalidParameters"
    assert words in failed["message"]
    assert await _condition(kube, "maybe", "Provisioned") is None or (
        (await _condition(kube, "maybe", "Provisioned") or {}).get("status") != "True")
    assert _acquires(provider) == 0


async def test_a_valid_until_past_the_last_date_means_no_deadline(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The policy accepts any run of digits (up to the CRD's 255 characters); creation plus
    # that many seconds is past the last date Python can represent.
    controller, clock, provider = running
    starve(provider)
    await _create(kube, "forever", {"ValidUntilSeconds": "9" * 255})

    async def attempted(n: int) -> bool:
        return _acquires(provider) >= n

    await _until(lambda: attempted(1))
    await asyncio.sleep(0.05)
    await clock.advance(controller.config.retry.backoff(1))
    await _until(lambda: attempted(2))
    assert await _condition(kube, "forever", "Failed") is None
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# Kueue's TAS pod-set annotations on a hand-written request's template, read as Kueue's
# webhook reads them (tests/kueue/test_tas_annotations.py holds the differential test).
@pytest.mark.parametrize(("annotations", "words"), [
    ({KUEUE_UNCONSTRAINED: "yes"},
     f"metadata.annotations[{KUEUE_UNCONSTRAINED}]: must be a boolean value"),
    ({KUEUE_UNCONSTRAINED: "T", KUEUE_REQUIRED: "topology.muster.dev/rack"},
     "metadata.annotations: must not contain more than one topology annotation"),
])
async def test_a_value_kueue_refuses_fails_the_request_naming_the_annotation(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider],
    annotations: dict[str, str], words: str,
) -> None:
    _, _, provider = running
    body = objects.pod_template("tas", namespace="ns", requests={"cpu": "1"})
    body["template"]["metadata"]["annotations"] = annotations
    await kube.create(POD_TEMPLATES, body, namespace="ns")
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "tas", namespace="ns", pod_sets=[("tas", 1)]), namespace="ns")
    failed = await _until(lambda: _true(kube, "tas", "Failed"))
    assert failed["reason"] == "InvalidParameters"
    assert "PodTemplate tas: " + words in failed["message"]
    assert not [c for c in provider.calls if c.op == "acquire"]
