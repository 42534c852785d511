"""The Helm chart (charts/muster), rendered with a real helm built from its Go module
(hack/install-helm.sh; cached under ~/.cache/muster/helm, built on first use): ``helm lint``
passes, and with default values it renders the same RBAC, Deployment, Service, disruption
budget, priority class, ServiceAccount and config as ``kubectl kustomize config/default``
(labels aside: the chart adds Helm's). Each value the chart offers changes what it should.

Installing the chart on a real control plane is the real-cluster suite's job (hack/cluster/);
these tests need no cluster.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import (
    CONFIG,
    ROOT,
    Doc,
    builtin_model,
    find,
    one,
    render,
    schema_errors,
)

CHART = ROOT / "charts" / "muster"
KUBE_VERSION = "1.34.0"
"""helm built with `go install` assumes Kubernetes 1.20 unless told; the chart needs 1.29+."""
NAMESPACE = "muster-system"

pytestmark = pytest.mark.timeout(900)  # the first test may build helm (minutes, once)


@pytest.fixture(scope="session")
def helm() -> str:
    proc = subprocess.run([str(ROOT / "hack" / "install-helm.sh")], capture_output=True,
                          text=True, timeout=900, check=False)
    if proc.returncode != 0:
        pytest.fail(f"hack/install-helm.sh could not build helm:\n{proc.stderr[-3000:]}",
                    pytrace=False)
    return proc.stdout.strip().splitlines()[-1]


def template(helm: str, *sets: str, release: str = "muster") -> list[Doc]:
    args = [helm, "template", release, str(CHART), "--namespace", NAMESPACE,
            "--kube-version", KUBE_VERSION, "--include-crds"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.fixture(scope="module")
def chart(helm: str) -> list[Doc]:
    return template(helm)


@pytest.fixture(scope="module")
def kustomized() -> list[Doc]:
    return render(CONFIG / "default")


def _key(doc: Doc) -> tuple[str, str, str | None]:
    return doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace")


def _strip(doc: Doc) -> Doc:
    """The object without what legitimately differs: metadata labels and annotations."""
    out = copy.deepcopy(doc)
    out["metadata"].pop("labels", None)
    out["metadata"].pop("annotations", None)
    return out


def test_helm_lint_is_clean(helm: str) -> None:
    proc = subprocess.run([helm, "lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_renders_the_objects_of_config_default(chart: list[Doc], kustomized: list[Doc]) -> None:
    # The Namespace (helm install --create-namespace, or your own with the Pod Security
    # label) and the ConfigMap's hashed name are the only differences in the list.
    skip = {"Namespace", "ConfigMap"}
    assert {_key(d) for d in chart if d["kind"] not in skip} == {
        _key(d) for d in kustomized if d["kind"] not in skip}
    problems = []
    for doc in chart:
        model = builtin_model(doc)
        if model is not None:
            problems += [f"{doc['kind']}/{doc['metadata']['name']}{e}"
                         for e in schema_errors(doc, model)]
    assert not problems, problems


@pytest.mark.parametrize("kind", [
    "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount", "Service",
    "PodDisruptionBudget", "PriorityClass", "CustomResourceDefinition",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
])
def test_same_objects_as_the_kustomization(
    chart: list[Doc], kustomized: list[Doc], kind: str,
) -> None:
    ours = {_key(d): _strip(d) for d in find(chart, kind)}
    theirs = {_key(d): _strip(d) for d in find(kustomized, kind)}
    assert ours == theirs


def test_same_deployment_and_config(chart: list[Doc], kustomized: list[Doc]) -> None:
    ours, theirs = one(chart, "Deployment", "muster"), one(kustomized, "Deployment", "muster")
    pod, their_pod = ours["spec"]["template"], theirs["spec"]["template"]
    # What differs by design: the image (kustomize's images: muster:dev; the chart's
    # repository:appVersion), the ConfigMap's name (kustomize hashes it, the chart rolls the
    # pods with a checksum annotation instead), Helm's labels.
    assert pod["spec"]["containers"][0].pop("image") == "muster:0.1.0"
    assert pod["spec"]["containers"][0].pop("imagePullPolicy") == "IfNotPresent"
    assert their_pod["spec"]["containers"][0].pop("image") == "muster:dev"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    their_volumes = {v["name"]: v for v in their_pod["spec"]["volumes"]}
    chart_cm = volumes["config"]["configMap"].pop("name")
    kust_cm = their_volumes["config"]["configMap"].pop("name")
    assert pod["metadata"]["annotations"].pop("checksum/config")
    assert _strip(ours) == _strip(theirs)
    # The config file itself: same settings.
    config = yaml.safe_load(one(chart, "ConfigMap", chart_cm)["data"]["config.yaml"])
    their_config = yaml.safe_load(one(kustomized, "ConfigMap", kust_cm)["data"]["config.yaml"])
    assert config == their_config


def test_crds_are_the_repository_s(chart: list[Doc]) -> None:
    ours, source = CHART / "crds" / "capacitypool.yaml", ROOT / "crds" / "capacitypool.yaml"
    assert ours.read_text() == source.read_text(), f"cp {source} {ours}"


@pytest.mark.parametrize(("value", "overlay"), [
    pytest.param("rbac.fakeProvider=true", "rbac/fake-provider", id="fake-provider"),
    pytest.param("rbac.kueue=true", "rbac/kueue", id="kueue"),
])
def test_optional_rbac_matches_its_kustomization(helm: str, chart: list[Doc], value: str,
                                                  overlay: str) -> None:
    extra = [d for d in template(helm, value) if _key(d) not in {_key(c) for c in chart}]
    assert sorted(_key(d) for d in extra) == sorted(_key(d) for d in render(CONFIG / overlay))
    theirs = {_key(d): _strip(d) for d in render(CONFIG / overlay)}
    assert {_key(d): _strip(d) for d in extra} == theirs


def test_no_node_writes_by_default(chart: list[Doc]) -> None:
    for role in find(chart, "ClusterRole") + find(chart, "Role"):
        for rule in role["rules"]:
            if {"nodes", "leases"} & set(rule.get("resources", [])):
                assert not {"create", "delete"} & set(rule["verbs"]) or (
                    role["metadata"].get("namespace") == NAMESPACE), role["metadata"]["name"]


def _container(docs: list[Doc]) -> Any:
    return find(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]


def test_values(helm: str) -> None:
    docs = template(
        helm, "image.repository=registry.example/muster", "image.tag=1.2.3", "replicas=3",
        "resources.limits.memory=4Gi",
        "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/muster",
        "providerCredentials.secretName=cloud-keys", "metrics.certSecretName=metrics-cert",
        "config.log_level=DEBUG", "priorityClass.name=system-cluster-critical",
    )
    deployment = one(docs, "Deployment")
    container = _container(docs)
    assert container["image"] == "registry.example/muster:1.2.3"
    assert deployment["spec"]["replicas"] == 3
    assert container["resources"]["limits"]["memory"] == "4Gi"
    sa = one(docs, "ServiceAccount")
    assert sa["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/muster"}
    # Credentials by reference: the Secret's keys as variables and its files, never its
    # content in the chart, and no RBAC on Secrets.
    assert container["envFrom"] == [{"secretRef": {"name": "cloud-keys"}}]
    pod = deployment["spec"]["template"]["spec"]
    assert {"name": "provider-credentials", "secret": {"secretName": "cloud-keys"}} in \
        pod["volumes"]
    assert not find(docs, "Secret")
    config = yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"])
    assert config["log_level"] == "DEBUG"
    assert config["server"]["metrics_cert_dir"] == "/etc/muster/metrics-tls"
    assert {"name": "metrics-tls", "secret": {"secretName": "metrics-cert"}} in pod["volumes"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert not find(docs, "PriorityClass")


def test_single_replica_has_no_disruption_budget_and_insecure_metrics_no_review_rights(
    helm: str,
) -> None:
    docs = template(helm, "replicas=1", "config.server.metrics_secure=false",
                    "metrics.service=false")
    assert not find(docs, "PodDisruptionBudget"), "it would block every node drain"
    assert not [r for r in find(docs, "ClusterRole") if "metrics" in r["metadata"]["name"]]
    assert not find(docs, "Service")


def test_release_name_and_config_drive_the_names(helm: str, tmp_path: Path) -> None:
    docs = template(helm, "config.leader_election.lease_name=gangs", release="prod")
    names = {d["metadata"]["name"] for d in docs}
    assert {"prod-muster", "prod-muster-leader-election", "prod-muster-config"} <= names
    role = one(docs, "Role", "prod-muster-leader-election")
    assert role["rules"][1]["resourceNames"] == ["gangs"]
    for binding in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "prod-muster", "namespace": NAMESPACE}]
    # The rendered config is valid for Muster.
    from controller.config import load_config

    file = tmp_path / "config.yaml"
    file.write_text(one(docs, "ConfigMap")["data"]["config.yaml"])
    assert load_config(file).leader_election.lease_name == "gangs"


@pytest.mark.real
@pytest.mark.parametrize("source", ["kustomize", "helm"])
def test_the_install_is_accepted_by_a_real_api_server(
    source: str, helm: str, real_cluster: Any,
) -> None:
    """Both install paths, applied server-side with dry run on the real control plane:
    schemas, defaulting, admission (the namespace's Pod Security level) and the API server's
    own validation accept every object. (Dry run: the real tier already runs Muster from
    these RBAC rules; a second copy of the same cluster-scoped objects would collide.)"""
    from e2e.cluster import kubectl

    docs = (render(CONFIG / "default") if source == "kustomize"
            else template(helm, "rbac.fakeProvider=true", "rbac.kueue=true"))
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    rest = [d for d in docs if d["kind"] != "Namespace"]
    for batch in (namespaces, rest):
        if not batch:
            continue
        body = yaml.safe_dump_all(batch)
        done = kubectl(real_cluster, "apply", "--server-side", "--force-conflicts",
                       "--dry-run=server", "--field-manager=muster-install-test", "-f", "-",
                       stdin=body, check=False)
        assert done.returncode == 0, done.stderr
