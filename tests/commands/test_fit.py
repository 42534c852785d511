"""``muster fit`` end to end through typer: tables, JSON, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from controller.cli import app

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples"
REQUEST = str(SAMPLES / "fit-request.yaml")
CLUSTER = str(SAMPLES / "fit-cluster.yaml")
POOLS = str(SAMPLES / "fit-pools.yaml")
runner = CliRunner()


def test_sample_fits_with_pools() -> None:
    result = runner.invoke(app, ["fit", REQUEST, "--snapshot", CLUSTER, "--pools", POOLS])
    assert result.exit_code == 0, result.output
    assert "FITS team-a/llm-train" in result.output
    assert "p5-b1" in result.output  # the cheaper pool in the chosen rack
    assert "$294.96/h" in result.output


def test_sample_json() -> None:
    result = runner.invoke(
        app, ["fit", REQUEST, "--snapshot", CLUSTER, "--pools", POOLS, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["fits"] is True
    assert data["mode"] == "provision"
    workers = [a for a in data["assignments"] if a["pod_set"] == "workers"]
    assert sum(a["pods"] for a in workers) == 6
    assert {p["pod_set"]: p["domain"] for p in data["placements"]}["workers"] == "b1-r0"
    assert data["new_nodes"] == [{"cost_per_hour": pytest.approx(294.96), "count": 3,
                                  "domain": {"topology.muster.dev/block": "b1",
                                             "topology.muster.dev/rack": "b1-r0"},
                                  "pool": "p5-b1"}]


def test_check_mode_does_not_fit() -> None:
    result = runner.invoke(
        app, ["fit", REQUEST, "--snapshot", CLUSTER, "--pools", POOLS, "--mode", "check"])
    assert result.exit_code == 1, result.output
    assert "DOES NOT FIT" in result.output
    assert "TopologyConstraint" in result.output


def test_nofit_json_reasons() -> None:
    # Without pools no rack (4 hosts) can ever hold 6 workers: permanent, then the detail.
    result = runner.invoke(app, ["fit", REQUEST, "--snapshot", CLUSTER, "--json"])
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["fits"] is False
    assert [r["code"] for r in data["reasons"]] == ["NeverFits", "TopologyConstraint"]
    assert data["permanent"] is True
    never, now = (r["message"] for r in data["reasons"])
    # The need is said once; the domains are named by their label values.
    assert "pod set workers needs 6 pods x 8 nvidia.com/gpu within one value of rack" in never
    assert "the best is rack b0-r0 (block b0) with room for 4" in never
    assert now == "now the best is rack b0-r1 (block b0) with room for 3"


def test_levels_option(tmp_path: Path) -> None:
    # With only the block level known, the rack annotation names an unknown level: Invalid.
    result = runner.invoke(app, ["fit", REQUEST, "--snapshot", CLUSTER, "--json",
                                 "--levels", "topology.muster.dev/block"])
    assert result.exit_code == 1
    assert json.loads(result.output)["reasons"][0]["code"] == "Invalid"


def test_bad_input_one_line_naming_the_field(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all(Path(REQUEST).read_text()))
    docs[0]["spec"]["podSets"][0]["count"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    result = runner.invoke(app, ["fit", str(bad), "--snapshot", CLUSTER])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "muster fit: ProvisioningRequest llm-train: spec.podSets[0].count: Input should be "
        "greater than or equal to 1"
    ]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        pytest.param(None, "No such file", id="missing-file"),
        pytest.param("a: [", "not valid YAML", id="broken-yaml"),
        pytest.param("- 1\n- 2\n", "must be a Kubernetes object", id="not-objects"),
        pytest.param("kind: Node\nmetadata: {name: n}\nstatus: {allocatable: {cpu: lots}}\n",
                     "status.allocatable.cpu", id="bad-node-quantity"),
    ],
)
def test_bad_cluster_file(tmp_path: Path, content: str | None, fragment: str) -> None:
    path = tmp_path / "cluster.yaml"
    if content is not None:
        path.write_text(content)
    result = runner.invoke(app, ["fit", REQUEST, "--snapshot", str(path)])
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert len(result.output.strip().splitlines()) == 1


def _edited_request(tmp_path: Path, edit: dict[str, object]) -> str:
    docs = list(yaml.safe_load_all(Path(REQUEST).read_text()))
    for doc in docs:
        if doc and doc.get("kind") == "PodTemplate":
            doc["template"]["spec"].update(edit)
    path = tmp_path / "request.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def test_a_constraint_muster_does_not_plan_is_refused(tmp_path: Path) -> None:
    request = _edited_request(tmp_path, {"runtimeClassName": "gvisor"})
    result = runner.invoke(app, ["fit", request, "--snapshot", CLUSTER, "--pools", POOLS])
    assert result.exit_code == 1, result.output
    assert "REFUSED" in result.output
    assert "runtimeClassName" in result.output


def test_a_misspelt_pod_spec_field_is_bad_input(tmp_path: Path) -> None:
    request = _edited_request(tmp_path, {"nodeSelecter": {"zone": "a"}})
    result = runner.invoke(app, ["fit", request, "--snapshot", CLUSTER, "--pools", POOLS])
    assert result.exit_code == 2, result.output
    assert "template.spec.nodeSelecter: unknown field" in result.output


# ------------------------------------------------------- classes: as the controller serves them


def _with_class(tmp_path: Path, class_name: str, **parameters: str) -> str:
    docs = list(yaml.safe_load_all(Path(REQUEST).read_text()))
    for doc in docs:
        if doc and doc.get("kind") == "ProvisioningRequest":
            doc["spec"]["provisioningClassName"] = class_name
            if parameters:
                doc["spec"]["parameters"] = parameters
    path = tmp_path / "request.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


@pytest.mark.parametrize(("class_name", "config", "mode", "code"), [
    ("check-capacity.muster.dev", None, "check", 1),
    ("atomic-provisioning.muster.dev", None, "provision", 0),
    ("check-capacity.autoscaling.x-k8s.io", "classes: {serve_upstream: true}", "check", 1),
    ("best-effort-atomic-scale-up.autoscaling.x-k8s.io", "classes: {serve_upstream: true}",
     "provision", 0),
    ("team-check", "classes: {check_capacity: [team-check]}", "check", 1),
])
def test_every_served_class_is_planned_in_the_controllers_mode(
    tmp_path: Path, class_name: str, config: str | None, mode: str, code: int,
) -> None:
    from controller.config import load_config

    args = ["fit", _with_class(tmp_path, class_name), "--snapshot", CLUSTER, "--pools", POOLS,
            "--json"]
    if config is not None:
        (tmp_path / "muster.yaml").write_text(config)
        args += ["--config", str(tmp_path / "muster.yaml")]
    result = runner.invoke(app, args)
    assert result.exit_code == code, result.output
    assert json.loads(result.output)["mode"] == mode
    # The controller's own choice for that class under that config.
    cfg = load_config(tmp_path / "muster.yaml" if config is not None else None)
    assert cfg.classes.mode_for(class_name) == mode


@pytest.mark.parametrize(("class_name", "parameters", "fragment"), [
    ("nope.example.com", {}, "'nope.example.com' is not served by Muster (served: "
     "check-capacity.muster.dev, atomic-provisioning.muster.dev)"),
    ("check-capacity.autoscaling.x-k8s.io", {}, "is not served by Muster"),
    ("check-capacity.muster.dev", {"processorInstance": "other"},
     "is left to another Muster instance"),
])
def test_a_class_the_controller_would_not_serve_is_bad_input(
    tmp_path: Path, class_name: str, parameters: dict[str, str], fragment: str,
) -> None:
    request = _with_class(tmp_path, class_name, **parameters)
    result = runner.invoke(app, ["fit", request, "--snapshot", CLUSTER, "--pools", POOLS])
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert len(result.output.strip().splitlines()) == 1
    # Asked explicitly, it is planned as asked.
    forced = runner.invoke(app, ["fit", request, "--snapshot", CLUSTER, "--pools", POOLS,
                                 "--mode", "provision"])
    assert forced.exit_code == 0, forced.output


# ------------------------------------------------------------- files in the wrong place


@pytest.mark.parametrize(("args", "fragment"), [
    ([CLUSTER, "--snapshot", REQUEST],
     f"REQUEST {CLUSTER} holds Node, Pod: that file belongs in the cluster's Nodes and Pods "
     "(--snapshot)"),
    ([REQUEST, "--snapshot", REQUEST],
     f"--snapshot {REQUEST} holds PodTemplate, ProvisioningRequest: that file belongs in the "
     "request and its PodTemplates (the first argument)"),
    ([POOLS, "--snapshot", CLUSTER], f"REQUEST {POOLS} holds CapacityPool: that file belongs "
     "in CapacityPools (--pools)"),
    ([REQUEST, "--snapshot", CLUSTER, "--pools", CLUSTER],
     f"--pools {CLUSTER} holds Node, Pod: that file belongs in the cluster's Nodes and Pods"),
    ([REQUEST, "--snapshot", CLUSTER, "--pools", REQUEST],
     f"--pools {REQUEST} holds PodTemplate, ProvisioningRequest"),
])
def test_a_file_in_the_wrong_place_is_named_as_such(args: list[str], fragment: str) -> None:
    result = runner.invoke(app, ["fit", *args])
    assert result.exit_code == 2, result.output
    assert fragment in " ".join(result.output.split())
    assert len(result.output.strip().splitlines()) == 1
