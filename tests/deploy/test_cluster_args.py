"""The real control plane's optional knobs (e2e/cluster.py), without starting it."""

from __future__ import annotations

import pytest

from e2e import cluster as cp


def test_controller_manager_keeps_its_default_client_limits_unless_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MUSTER_CLUSTER_KCM_API_QPS", raising=False)
    assert cp._kcm_client_limits() == []
    monkeypatch.setenv("MUSTER_CLUSTER_KCM_API_QPS", "200")
    assert cp._kcm_client_limits() == ["--kube-api-qps=200", "--kube-api-burst=400"]
    monkeypatch.setenv("MUSTER_CLUSTER_KCM_API_QPS", "lots")
    with pytest.raises(cp.ClusterError, match="MUSTER_CLUSTER_KCM_API_QPS"):
        cp._kcm_client_limits()
