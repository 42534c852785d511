"""Authentication and authorization of /metrics (controller/commands/metrics_auth.py) against
a stand-in API client: the answers per case, what is cached for how long, API errors, and the
self-signed certificate. tests/deploy/test_run_smoke.py scrapes a real ``muster run``."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from controller.commands.metrics_auth import ALLOW_TTL, AUTHN_TTL, DENY_TTL, MetricsAuth, server_tls
from controller.kube import ApiError
from controller.kube.resources import Resource


class FakeKube:
    def __init__(self, users: dict[str, str], allowed: set[str]) -> None:
        self.users, self.allowed = users, allowed
        self.calls: list[str] = []
        self.fail = False

    async def create(self, res: Resource, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(res.kind)
        if self.fail:
            raise ApiError(503, "ServiceUnavailable")
        spec = body["spec"]
        if res.kind == "TokenReview":
            name = self.users.get(spec["token"])
            return {"status": {"authenticated": True, "user": {"username": name, "uid": name}}
                    if name else {"authenticated": False}}
        assert spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        return {"status": {"allowed": spec["user"] in self.allowed}}


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _request(token: str | None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return make_mocked_request("GET", "/metrics", headers=headers)


async def _status(auth: MetricsAuth, token: str | None) -> int:
    refused = await auth.check(_request(token))
    return 200 if refused is None else refused.status


@pytest.mark.parametrize(("token", "status"), [
    pytest.param(None, 401, id="no-token"),
    pytest.param("forged", 401, id="unknown-token"),
    pytest.param("team", 403, id="authenticated-not-allowed"),
    pytest.param("prom", 200, id="allowed"),
])
async def test_answers(token: str | None, status: int) -> None:
    kube = FakeKube({"prom": "prometheus", "team": "team-a"}, {"prometheus"})
    auth = MetricsAuth(kube)  # type: ignore[arg-type]
    assert await _status(auth, token) == status


async def test_decisions_are_cached_like_the_delegating_authorizer() -> None:
    kube = FakeKube({"prom": "prometheus", "team": "team-a"}, set())
    clock = Clock()
    auth = MetricsAuth(kube, clock=clock)  # type: ignore[arg-type]
    assert await _status(auth, "prom") == 403
    assert kube.calls == ["TokenReview", "SubjectAccessReview"]
    kube.allowed.add("prometheus")  # a ClusterRoleBinding appears
    assert await _status(auth, "prom") == 403, "denied is cached"
    assert len(kube.calls) == 2
    clock.now += DENY_TTL + 1
    assert await _status(auth, "prom") == 200
    assert kube.calls[-1] == "SubjectAccessReview"
    calls = len(kube.calls)
    kube.allowed.clear()
    clock.now += AUTHN_TTL - DENY_TTL - 2  # within both the token's and the decision's TTL
    assert await _status(auth, "prom") == 200, "allowed is cached longer"
    assert len(kube.calls) == calls
    clock.now += ALLOW_TTL
    assert await _status(auth, "prom") == 403


async def test_api_errors_answer_500_and_are_not_cached() -> None:
    kube = FakeKube({"prom": "prometheus"}, {"prometheus"})
    auth = MetricsAuth(kube)  # type: ignore[arg-type]
    kube.fail = True
    assert await _status(auth, "prom") == 500
    kube.fail = False
    assert await _status(auth, "prom") == 200


def test_self_signed_certificate_serves_tls(tmp_path: Path) -> None:
    context = server_tls(None, tmp_path / "tls")
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert (tmp_path / "tls" / "tls.key").stat().st_mode & 0o077 == 0, "key readable by owner only"
    # A given directory is used as is (cert-manager's Secret layout).
    again = server_tls(tmp_path / "tls", tmp_path / "unused")
    assert isinstance(again, ssl.SSLContext)
    assert not (tmp_path / "unused").exists()
