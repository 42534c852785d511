"""The shipped DRA samples work with `muster fit`, and the sandbox-only CRDs are well formed."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from controller.cli import app

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "config" / "samples"


def test_dra_sample_provisions_one_node_with_device_allocations() -> None:
    result = CliRunner().invoke(app, [
        "fit", str(SAMPLES / "dra-request.yaml"), "--snapshot", str(SAMPLES / "dra-cluster.yaml"),
        "--pools", str(SAMPLES / "dra-pools.yaml"), "--mode", "provision", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [(n["pool"], n["count"]) for n in out["new_nodes"]] == [("h100-dra", 1)]
    first = out["assignments"][0]
    pod = first["devices"][0][0]
    assert pod["claim"] == "c0"
    assert {r["request"] for r in pod["results"]} == {"gpu", "nic"}
    assert {r["pool"] for r in pod["results"]} == {first["node"]}


def test_dra_sample_does_not_fit_existing_nodes_alone() -> None:
    result = CliRunner().invoke(app, [
        "fit", str(SAMPLES / "dra-request.yaml"), "--snapshot", str(SAMPLES / "dra-cluster.yaml"),
        "--mode", "check"])
    assert result.exit_code == 1
    assert "room for 16" in result.output


def test_sandbox_crds_define_the_four_dra_kinds() -> None:
    docs = list(yaml.safe_load_all((ROOT / "e2e" / "sandbox-crds" /
                                     "resource.k8s.io_v1.yaml").read_text()))
    kinds = {d["spec"]["names"]["kind"]: d for d in docs}
    assert set(kinds) == {"DeviceClass", "ResourceSlice", "ResourceClaim",
                          "ResourceClaimTemplate"}
    for d in docs:
        assert d["metadata"]["name"] == f"{d['spec']['names']['plural']}.resource.k8s.io"
        assert [v["name"] for v in d["spec"]["versions"]] == ["v1"]
    assert kinds["ResourceClaim"]["spec"]["scope"] == "Namespaced"
    assert kinds["ResourceSlice"]["spec"]["scope"] == "Cluster"
