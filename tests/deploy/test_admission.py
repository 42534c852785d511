"""Admission at the door (config/admission): ValidatingAdmissionPolicies that refuse at
creation what Muster would fail later. The sandbox evaluates no CEL, so the policies are
tried on the real tier; a sandbox-tier test keeps their lists equal to the code's."""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from controller.api.parameters import (
    HONOURED,
    MAX_RUN_DURATION_SECONDS,
    NO_RETRY,
    RELAX_TOPOLOGY_AFTER,
    VALID_UNTIL_SECONDS,
)
from controller.commands import objects
from controller.fit.types import Mode
from providers.fake import KNOWN_PARAMETERS
from providers.registry import names
from tests.deploy.manifests import CONFIG

POLICIES = CONFIG / "admission"


def _policy(name: str) -> dict[str, Any]:
    for doc in yaml.safe_load_all((POLICIES / f"{name}-policy.yaml").read_text()):
        if doc and doc["kind"] == "ValidatingAdmissionPolicy":
            return dict(doc)
    raise AssertionError(name)


def _quoted(expression: str) -> set[str]:
    return set(re.findall(r"'([^']+)'", expression))


def test_the_policies_know_what_the_code_knows() -> None:
    pool = _policy("capacitypool")
    rules = [v["expression"] for v in pool["spec"]["validations"]]
    providers = next(r for r in rules if "object.spec.provider in" in r and "parameters" not in r)
    assert _quoted(providers) == set(names())
    fake = next(r for r in rules if "parameters.all" in r)
    assert _quoted(fake) - {"kind", "fake"} == set(KNOWN_PARAMETERS)
    request = _policy("provisioningrequest")
    checked = {name for v in request["spec"]["validations"]
               for name in re.findall(r"'(\w+)' in variables.params", v["expression"])}
    # The honoured parameters whose values Muster reads (and fails when it cannot).
    assert checked == {NO_RETRY, VALID_UNTIL_SECONDS, RELAX_TOPOLOGY_AFTER,
                       MAX_RUN_DURATION_SECONDS}
    assert checked <= HONOURED[Mode.CHECK] | HONOURED[Mode.PROVISION]


# --------------------------------------------------------------------------- real tier


@pytest.fixture
def kube_admin(real_cluster: Any) -> Iterator[Any]:
    from e2e.cluster import kubectl

    def run(*args: str, stdin: str | None = None) -> Any:
        return kubectl(real_cluster, *args, stdin=stdin, check=False)

    yield run


def _pool(**spec: Any) -> dict[str, Any]:
    body = objects.gpu_pool(f"adm-{uuid.uuid4().hex[:6]}")
    body["spec"].update(spec)
    return body


BAD_POOLS = [
    pytest.param({"provider": "azure"}, "unknown provider", id="unknown-provider"),
    pytest.param({"minNodes": 9, "maxNodes": 4}, "exceeds spec.maxNodes", id="min-over-max"),
    pytest.param({"nodeTemplate": {"allocatable": {"cpu": "lots"}}}, "quantity",
                 id="bad-quantity"),
    pytest.param({"parameters": {"colour": "blue"}}, "fake provider knows",
                 id="unknown-fake-parameter"),
    pytest.param({"expectedReadySeconds": 300, "registrationTimeoutSeconds": 60},
                 "shorter than spec.expectedReadySeconds", id="registration-budget-too-short"),
]


@pytest.mark.real
@pytest.mark.parametrize(("spec", "words"), BAD_POOLS)
def test_an_invalid_pool_is_refused_at_creation(
    kube_admin: Any, spec: dict[str, Any], words: str,
) -> None:
    body = _pool(**spec)
    done = kube_admin("create", "-f", "-", stdin=yaml.safe_dump(body))
    assert done.returncode != 0 and words in done.stderr, done.stderr


@pytest.mark.real
def test_a_valid_pool_passes(kube_admin: Any) -> None:
    done = kube_admin("create", "--dry-run=server", "-f", "-",
                      stdin=yaml.safe_dump(_pool()))
    assert done.returncode == 0, done.stderr


def _request(cls: str, params: dict[str, str], labels: dict[str, str] | None = None
             ) -> dict[str, Any]:
    body = objects.provisioning_request(
        f"adm-{uuid.uuid4().hex[:6]}", pod_sets=[("workers", 1)], namespace="default",
        class_name=cls, parameters=params,
    )
    if labels:
        body["metadata"]["labels"] = labels
    return copy.deepcopy(body)


@pytest.mark.real
@pytest.mark.parametrize(("cls", "params", "labels", "refused"), [
    pytest.param("atomic-provisioning.muster.dev", {"noRetry": "maybe"}, None, True,
                 id="unreadable-noRetry"),
    pytest.param("check-capacity.muster.dev", {"ValidUntilSeconds": "soon"}, None, True,
                 id="unreadable-ValidUntilSeconds"),
    pytest.param("check-capacity.muster.dev", {"noRetry": " True "}, None, False,
                 id="readable-noRetry"),
    pytest.param("atomic-provisioning.muster.dev", {"colour": "blue"}, None, False,
                 id="unknown-name-is-ignored-by-muster-not-refused"),
    pytest.param("atomic-provisioning.muster.dev", {"noRetry": "maybe"},
                 {"kueue.x-k8s.io/managed": "true"}, False, id="created-by-kueue"),
    pytest.param("queued-provisioning.gke.io", {"noRetry": "maybe"}, None, False,
                 id="not-a-muster-class"),
])
def test_requests_of_muster_classes_are_checked_at_creation(
    kube_admin: Any, cls: str, params: dict[str, str], labels: dict[str, str] | None,
    refused: bool,
) -> None:
    body = _request(cls, params, labels)
    done = kube_admin("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(body))
    if refused:
        assert done.returncode != 0 and "spec.parameters" in done.stderr, done.stderr
    else:
        assert done.returncode == 0, done.stderr
