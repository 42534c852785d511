"""The cloud tier's Compute endpoint: Muster's GCP provider, built as ``muster run`` builds it
(Application Default Credentials, ``api_endpoint`` from its settings), talks HTTP to the
Compute fake, and what it launched registers as the nodes kubelet and the CCM would write."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.acquire.keys import acquisition_key
from e2e.cloud.gce import compute_endpoint, credentials_file, gcp_env
from e2e.cloud.kubelet import gce_node
from providers.base import AcquireRequest
from providers.gcp import GcpProviderSettings, make_gcp_provider
from tests.providers.conftest import GCP_ZONE, ZONE_LABEL, gcp_parameters, make_pool


async def test_default_credentials_and_endpoint_reach_the_fake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with compute_endpoint() as (url, compute):
        for key, value in gcp_env(url, credentials_file(url, tmp_path / "adc.json")).items():
            monkeypatch.setenv(key, value)
        provider = make_gcp_provider(GcpProviderSettings(cluster_name="c"))
        pool = make_pool(
            "gcp",
            gcp_parameters(project="muster-cloud", metadata={"kube-env": "NODE_LABELS: team=ml\n"}),
        )
        request = AcquireRequest(
            key=acquisition_key("u", 0, 0),
            pool=pool,
            count=2,
            domain={ZONE_LABEL: GCP_ZONE},
            owner="ml/u",
            owner_uid="u",
        )
        nodes = await provider.acquire(request)
        assert compute.calls("bulk_insert"), "the provider spoke HTTP to the fake"
        registered = [gce_node("muster-cloud", i) for i in compute.all_instances()]
    assert sorted(n["spec"]["providerID"] for n in registered if n) == sorted(
        n.provider_id for n in nodes
    )
    subblocks = {n.labels["cloud.google.com/gce-topology-subblock"] for n in nodes}
    assert len(subblocks) == 1, "one bulkInsert lands in one sub-block"
    for node in registered:
        assert node is not None
        assert node["metadata"]["labels"]["team"] == "ml"
        assert node["spec"]["taints"] == [{"key": "muster.dev/unregistered", "effect": "NoExecute"}]
