"""The Kueue samples stay valid: every Kueue object parses with Muster's models, every
check points at an existing config, and Muster's sample config loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controller.config import load_config
from controller.kueue.models import (
    AdmissionCheck,
    ClusterQueue,
    ProvisioningRequestConfig,
    ResourceFlavor,
    Topology,
)

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples" / "kueue"
MODELS = {m.__name__: m for m in (AdmissionCheck, ClusterQueue, ProvisioningRequestConfig,
                                  ResourceFlavor, Topology)}


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("path-*/kueue-wiring.yaml")),
                         ids=lambda p: p.parent.name)
def test_wiring_objects_parse_and_reference_each_other(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    names: dict[str, set[str]] = {}
    for doc in docs:
        assert doc["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        model = MODELS.get(doc["kind"])
        if model is not None:
            model.model_validate(doc)
        names.setdefault(doc["kind"], set()).add(doc["metadata"]["name"])
    for doc in docs:
        if doc["kind"] == "AdmissionCheck" and doc["spec"].get("parameters"):
            assert doc["spec"]["parameters"]["name"] in names["ProvisioningRequestConfig"]
        if doc["kind"] == "ClusterQueue":
            for rule in doc["spec"]["admissionChecksStrategy"]["admissionChecks"]:
                assert rule["name"] in names["AdmissionCheck"]
        if doc["kind"] == "ResourceFlavor" and doc["spec"].get("topologyName"):
            assert doc["spec"]["topologyName"] in names["Topology"]


def test_muster_kueue_config_loads() -> None:
    cfg = load_config(SAMPLES / "muster-kueue.yaml")
    assert cfg.kueue.enabled and cfg.kueue.controller_name == "muster.dev/provisioning"
