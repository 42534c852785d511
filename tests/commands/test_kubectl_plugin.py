"""``kubectl muster`` without a cluster: Job conversion, what-if planning on a ClusterState,
output tables, and one-line errors with exit 2 (the live-cluster runs are in
e2e/test_visibility.py, on both tiers)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from controller.commands import objects
from controller.commands.kubectl_plugin import (
    PluginError,
    _print_plan,
    app,
    capacity_rows,
    job_documents,
    plan_payload,
    read_fit_file,
    table_text,
    what_if,
)
from controller.common.topology_defaults import DEFAULT_LEVELS, MUSTER_REQUIRED, POOL_LABEL
from controller.config import MusterConfig
from controller.state.cache import ClusterState
from tests.cluster_objects import gpu_node

ROOT = Path(__file__).resolve().parents[2]


def _job(parallelism: int = 3, completions: int | None = None) -> dict:
    spec: dict = {"parallelism": parallelism, "template": {
        "metadata": {"annotations": {MUSTER_REQUIRED: objects.RACK}},
        "spec": {"restartPolicy": "Never", "tolerations": [objects.GPU_TOLERATION],
                 "containers": [{"name": "w", "image": "x", "resources": {
                     "requests": {"cpu": "90", objects.GPU: "8"},
                     "limits": {objects.GPU: "8"}}}]}}}
    if completions is not None:
        spec["completions"] = completions
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
            "spec": spec}


def test_the_executable_is_installed_by_the_package() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-muster"] == "controller.commands.kubectl_plugin:main"


def test_a_job_is_a_gang_of_its_parallel_pods() -> None:
    template, request = job_documents(_job(4, completions=2), "team")
    assert request["spec"]["podSets"] == [{"podTemplateRef": {"name": "train-pods"},
                                           "count": 2}]
    assert request["metadata"]["namespace"] == template["metadata"]["namespace"] == "team"
    assert request["spec"]["provisioningClassName"] == "atomic-provisioning.muster.dev"
    with pytest.raises(PluginError, match="parallelism"):
        job_documents({**_job(), "spec": {**_job()["spec"], "parallelism": 0}}, "team")


async def test_what_if_plans_a_job_on_the_controller_s_cache() -> None:
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([objects.gpu_pool("gpu", blocks=1, racks_per_block=2,
                                          nodes_per_rack=4)])
    state.replace_nodes([gpu_node(f"n{i}", rack="b1-r2", **{POOL_LABEL: "gpu"})
                         for i in range(2)])
    template, request = job_documents(_job(3), "team")
    got = plan_payload(await what_if(state, MusterConfig(), request, [template]))
    # Two existing nodes in b1-r2 plus one new one there beat three new ones in b1-r1.
    assert got["fits"] is True and got["existingNodes"] == {"n0": 1, "n1": 1}
    assert got["newNodes"] == [{"pool": "gpu", "count": 1, "costPerHour": 98.0, "domain": {
        objects.BLOCK: "b1", objects.RACK: "b1-r2"}}]

    template, request = job_documents(_job(5), "team")
    got = plan_payload(await what_if(state, MusterConfig(), request, [template]))
    assert got["fits"] is False and got["permanent"] is True
    assert "can never appear" in got["shortfall"]


async def test_what_if_waits_for_a_refused_pool_that_would_serve_the_gang(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # As the controller says PoolUnusable (not CapacityNeverFits) when only a pool the
    # provider refuses could hold the gang.
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([objects.gpu_pool("gpu", blocks=1, racks_per_block=2,
                                          nodes_per_rack=4)])
    state.set_pool_unusable("gpu", ("spec.parameters: no credentials",))
    template, request = job_documents(_job(3), "team")
    got = plan_payload(await what_if(state, MusterConfig(), request, [template]))
    assert got["fits"] is False and got["permanent"] is False
    assert got["unusablePools"] == {"gpu": ["spec.parameters: no credentials"]}
    _print_plan(got)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("WAITS FOR POOL team/train (mode provision): CapacityPool gpu "
                            "(spec.parameters: no credentials). Without it: "), first

    # Five racks' worth would not fit even in the fixed pool: that never fits.
    template, request = job_documents(_job(5), "team")
    got = plan_payload(await what_if(state, MusterConfig(), request, [template]))
    assert got["permanent"] is True and got["unusablePools"] == {}
    _print_plan(got)
    assert capsys.readouterr().out.startswith("NEVER FITS team/train")


def test_fit_file_errors_are_one_line(tmp_path: Path) -> None:
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump_all([_job(), _job()]))
    with pytest.raises(PluginError, match="expected one ProvisioningRequest or one"):
        read_fit_file(two, "default")
    runner = CliRunner()
    for args in (["fit", "-f", str(tmp_path / "absent.yaml")],
                 ["fit", "-f", str(two)],
                 ["capacity", "--kubeconfig", str(tmp_path / "nope")],
                 ["explain", "x", "--config", str(tmp_path / "absent-config.yaml")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.output)


def test_capacity_rows_and_table() -> None:
    pools = [
        {"metadata": {"name": "a"}, "status": {"conditions": [
            {"type": "Valid", "status": "False", "message": "1 problem(s): x"}]}},
        {"metadata": {"name": "b"}, "status": {"conditions": [
            {"type": "Valid", "status": "True"}], "domains": [
            {"name": "b1/b1-r1", "labels": {}, "nodes": 2, "provisionableNodes": 3}]}},
        {"metadata": {"name": "c"}},
    ]
    rows = capacity_rows(pools)
    assert [(r["pool"], r["domain"], r.get("problem")) for r in rows] == [
        ("a", "-", "1 problem(s): x"), ("b", "b1/b1-r1", None),
        ("c", "-", "no status yet (is Muster running?)")]
    assert table_text(("A", "BB"), [("x", 1), ("long", 22)]) == "A      BB\nx      1\nlong   22"
