"""The kustomize tree under config/: every kustomization renders with the real
``kubectl kustomize``, the rendered objects use only fields the Kubernetes types have, the
install is internally consistent (config file valid for Muster, ports and probes agree, the
Deployment is locked down), and ``kubectl apply`` puts it into the API sandbox.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from controller.api.capacitypool import CapacityPool
from controller.api.parameters import read_parameters
from controller.api.provisioningrequest import ProvisioningRequest
from controller.config import ATOMIC_CLASS, CHECK_CAPACITY_CLASS, load_config
from controller.fit.types import Mode
from providers.fake import FakeProvider
from sandbox import ResourceType, SandboxServer
from tests.deploy import dockerfile
from tests.deploy.manifests import (
    CONFIG,
    ROOT,
    Doc,
    builtin_model,
    find,
    kubectl_async,
    kustomizations,
    one,
    render,
    schema_errors,
    yaml_dump,
)

NAMESPACE = "muster-system"


def _load_sync_crds() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sync_crds", ROOT / "hack" / "sync_crds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sync_crds"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def default() -> list[Doc]:
    return render(CONFIG / "default")


@pytest.fixture(scope="module")
def deployment(default: list[Doc]) -> Doc:
    return one(default, "Deployment", "muster")


@pytest.fixture(scope="module")
def container(deployment: Doc) -> Doc:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


# ---------------------------------------------------------------- rendering

def test_the_tree_has_the_kustomizations_users_apply() -> None:
    found = {p.relative_to(CONFIG).as_posix() for p in kustomizations()}
    assert {
        "crds", "crds/provisioningrequest", "rbac", "rbac/fake-provider", "rbac/kueue", "manager",
        "default",
        "samples", "samples/kueue/path-a", "samples/kueue/path-b", "samples/kueue/queued",
    } <= found


@pytest.mark.parametrize(
    "directory", kustomizations(), ids=lambda p: p.relative_to(CONFIG).as_posix()
)
def test_every_kustomization_renders_to_valid_objects(directory: Path) -> None:
    docs = render(directory)
    assert docs, "renders to nothing"
    problems = []
    for doc in docs:
        where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if not doc.get("apiVersion") or not doc.get("kind") or not doc["metadata"].get("name"):
            problems.append(f"{where}: apiVersion, kind and metadata.name are required")
        model = builtin_model(doc)
        if model is not None:
            problems += [f"{where}{e}" for e in schema_errors(doc, model)]
    assert not problems, "\n".join(problems)


def test_crd_copies_in_config_equal_crds_dir() -> None:
    sync = _load_sync_crds()
    problems = sync.differences(sync.plan())
    assert not problems, "config/crds is out of date; run python3 hack/sync_crds.py: " + str(
        problems
    )
    names = {d["metadata"]["name"] for d in render(CONFIG / "crds")}
    assert "capacitypools.muster.dev" in names
    assert "provisioningrequests.autoscaling.x-k8s.io" not in names, (
        "config/default must never install the autoscaler's CRD"
    )
    provreq = render(CONFIG / "crds" / "provisioningrequest")
    assert [d["metadata"]["name"] for d in provreq] == ["provisioningrequests.autoscaling.x-k8s.io"]


def test_sync_refuses_a_crd_defined_twice(tmp_path: Path) -> None:
    sync = _load_sync_crds()
    crd = (ROOT / "crds").glob("*capacitypool*.yaml").__next__().read_text()
    (tmp_path / "a.yaml").write_text(crd)
    (tmp_path / "b.yaml").write_text(crd)
    with pytest.raises(sync.SyncError, match="defined twice"):
        sync.plan(tmp_path)


# ---------------------------------------------------------------- the install

def test_default_install_contents(default: list[Doc]) -> None:
    kinds = sorted({d["kind"] for d in default})
    assert kinds == sorted({
        "Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole",
        "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "Service", "Deployment",
        "PodDisruptionBudget", "PriorityClass", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    })
    ns = one(default, "Namespace", NAMESPACE)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for doc in default:
        if doc["kind"] in ("ServiceAccount", "ConfigMap", "Service", "Deployment"):
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]
    # Least privilege: no Node create/delete or node-Lease writes unless asked for (the fake
    # provider's RBAC is its own kustomization, which e2e/kind adds); patch only, to register
    # the nodes Muster's acquisitions launched.
    assert not [d for d in default if "fake-provider" in d["metadata"]["name"]]
    for role in find(default, "ClusterRole") + find(default, "Role"):
        for rule in role["rules"]:
            if "nodes" in rule.get("resources", []):
                assert set(rule["verbs"]) <= {"list", "watch", "patch"}, role["metadata"]["name"]
            if "leases" in rule.get("resources", []):
                assert role["metadata"].get("namespace") == NAMESPACE
    fake = render(CONFIG / "rbac" / "fake-provider")
    # Leases of the fake provider's nodes live where the node lifecycle controller reads them.
    assert one(fake, "Role", "muster-fake-provider")["metadata"]["namespace"] == \
        "kube-node-lease"
    # The leader-election Lease lives in Muster's own namespace (the pod's service-account
    # namespace, which `muster run` reads when leader_election.namespace is unset).
    assert one(default, "Role", "muster-leader-election")["metadata"]["namespace"] == NAMESPACE


def test_shipped_config_is_valid_for_muster(
    default: list[Doc], deployment: Doc, container: Doc, tmp_path: Path
) -> None:
    cm_name = next(
        v["configMap"]["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]
        if "configMap" in v
    )
    cm = one(default, "ConfigMap", cm_name)  # kustomize rewrote the hashed name consistently
    args = container["args"]
    config_path = args[args.index("--config") + 1]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert Path(config_path).parent.as_posix() == mount["mountPath"]
    assert Path(config_path).name in cm["data"]
    assert "--in-cluster" in args
    file = tmp_path / "config.yaml"
    file.write_text(cm["data"][Path(config_path).name])
    cfg = load_config(file)  # unknown keys or bad values raise ConfigError
    assert cfg.log_format == "json", "the cluster config logs JSON for log collectors"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": cfg.server.metrics_port, "probes": cfg.server.probe_port}
    paths = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in paths.items():
        get = container[probe]["httpGet"]
        assert get["port"] in ("probes", cfg.server.probe_port), probe
        assert get["path"] == path, probe
    # The replicas elect a leader, and the RBAC lets them use exactly the configured Lease.
    election = cfg.leader_election
    assert election.enabled and election.namespace in (None, NAMESPACE)
    role = one(default, "Role", "muster-leader-election")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert [r["resourceNames"] for r in named] == [[election.lease_name]]
    svc = one(default, "Service", "muster-metrics")
    assert svc["spec"]["ports"][0]["targetPort"] in ("metrics", cfg.server.metrics_port)
    assert svc["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"][
        "labels"].items()


def test_deployment_is_locked_down(deployment: Doc, container: Doc) -> None:
    spec = deployment["spec"]
    # Leader election makes a standby safe: at least two replicas, and a rollout that never
    # leaves fewer ready than asked (the new pod stands by until the old leader hands over).
    assert spec["replicas"] >= 2
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    image_user = dockerfile.parse(ROOT / "Dockerfile").final.all("USER")[-1].args
    assert str(pod["securityContext"]["runAsUser"]) == image_user.split(":")[0]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    res = container["resources"]
    assert {"cpu", "memory"} <= res["requests"].keys() and {"cpu", "memory"} <= res[
        "limits"].keys()
    # The only writable place is an emptyDir at /tmp, where the image points HOME and caches.
    tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    volume = next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    assert "emptyDir" in volume
    assert container["image"] == "muster:dev"
    assert pod["serviceAccountName"] == "muster"


def test_disruption_budget_and_priority(default: list[Doc], deployment: Doc) -> None:
    pdb = one(default, "PodDisruptionBudget", "muster")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # One replica may go (a drain) while the other takes the Lease over; never all of them.
    assert pdb["spec"]["minAvailable"] == 1 < deployment["spec"]["replicas"]
    name = deployment["spec"]["template"]["spec"]["priorityClassName"]
    priority = one(default, "PriorityClass", name)
    assert 0 < priority["value"] < 1_000_000_000, "above workloads, below the system classes"
    assert priority["globalDefault"] is False


def test_metrics_are_https_for_authorized_scrapers_only(default: list[Doc],
                                                       container: Doc) -> None:
    cm = find(default, "ConfigMap")[0]
    server = yaml.safe_load(cm["data"]["config.yaml"])["server"]
    assert server["metrics_secure"] is True
    reader = one(default, "ClusterRole", "muster-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    auth = one(default, "ClusterRole", "muster-metrics-auth")
    assert {(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in auth["rules"]} == {
        ("authentication.k8s.io", "tokenreviews", ("create",)),
        ("authorization.k8s.io", "subjectaccessreviews", ("create",)),
    }
    # Bound to nobody: who scrapes is the cluster's choice (docs/reference/metrics.md).
    assert not [b for b in find(default, "ClusterRoleBinding")
                if b["roleRef"]["name"] == "muster-metrics-reader"]


def test_rbac_binds_the_deployment_account_without_wildcards_or_secrets(
    default: list[Doc], deployment: Doc
) -> None:
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    one(default, "ServiceAccount", account)
    bound_roles = {("ClusterRole", "muster-metrics-reader")}  # for Prometheus, bound by users
    for binding in find(default, "ClusterRoleBinding") + find(default, "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        ]
        ref = binding["roleRef"]
        role = one(default, ref["kind"], ref["name"])
        if binding["kind"] == "RoleBinding" and ref["kind"] == "Role":
            assert role["metadata"]["namespace"] == binding["metadata"]["namespace"]
        bound_roles.add((ref["kind"], ref["name"]))
    roles = find(default, "ClusterRole") + find(default, "Role")
    assert {(r["kind"], r["metadata"]["name"]) for r in roles} == bound_roles
    for role in roles:
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs", "nonResourceURLs"):
                assert "*" not in rule.get(key, []), (
                    f"{role['metadata']['name']}: wildcard in {key}")
            assert "secrets" not in rule.get("resources", [])
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
            assert "resourceNames" not in rule or rule["resourceNames"]


# ---------------------------------------------------------------- samples

async def test_sample_pools_and_request_are_valid_for_muster() -> None:
    docs = render(CONFIG / "samples")
    pools = [CapacityPool.model_validate(d) for d in find(docs, "CapacityPool")]
    assert {p.spec.provider for p in pools} <= {"kind", "fake"}
    provider = FakeProvider.__new__(FakeProvider)  # validate() only reads the pool
    for pool in pools:
        await FakeProvider.validate(provider, pool)
    requests = [ProvisioningRequest.model_validate(d) for d in find(docs, "ProvisioningRequest")]
    assert requests
    templates = {(d["metadata"]["namespace"], d["metadata"]["name"])
                 for d in find(docs, "PodTemplate")}
    namespaces = {d["metadata"]["name"] for d in find(docs, "Namespace")}
    for pr in requests:
        assert pr.spec.provisioning_class_name in (ATOMIC_CLASS, CHECK_CAPACITY_CLASS)
        assert pr.metadata.namespace in namespaces
        for pod_set in pr.spec.pod_sets:
            assert (pr.metadata.namespace, pod_set.pod_template_ref.name) in templates


KUEUE_CRDS = ROOT / "e2e" / "kueue-crds"
"""Stand-in Kueue CRDs (the Kueue integration's, for the sandbox only): Kueue's real CRDs come
with its release, which cannot be downloaded here."""


def _by_kind(docs: list[Doc]) -> dict[str, dict[str, Doc]]:
    out: dict[str, dict[str, Doc]] = {}
    for d in docs:
        out.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    return out


def test_kueue_path_a_uses_the_builtin_check_with_a_muster_class() -> None:
    objs = _by_kind(render(CONFIG / "samples" / "kueue" / "path-a"))
    (check,) = objs["AdmissionCheck"].values()
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/provisioning-request"
    prc = objs["ProvisioningRequestConfig"][check["spec"]["parameters"]["name"]]
    cfg = load_config()
    assert prc["spec"]["provisioningClassName"] in cfg.classes.atomic + cfg.classes.check_capacity
    # Kueue copies these detail keys into the pods' nodeSelector: Muster writes one per level.
    for entry in prc["spec"]["podSetUpdates"]["nodeSelector"]:
        assert entry["key"] in cfg.topology.levels
        assert entry["valueFromProvisioningClassDetail"] == entry["key"]
    # TAS flavors belong on this path (Kueue delays topology only for its own check).
    assert any(rf["spec"].get("topologyName") for rf in objs["ResourceFlavor"].values())


def test_kueue_queued_sample_names_the_queued_class_with_a_readable_run_duration() -> None:
    objs = _by_kind(render(CONFIG / "samples" / "kueue" / "queued"))
    (check,) = objs["AdmissionCheck"].values()
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/provisioning-request"
    prc = objs["ProvisioningRequestConfig"][check["spec"]["parameters"]["name"]]
    assert prc["spec"]["provisioningClassName"] in load_config().classes.queued
    # Kueue passes the parameters through unchecked: Muster must read each one.
    params = read_parameters(prc["spec"]["parameters"], Mode.PROVISION, "queued")
    assert not params.problems and not params.ignored
    assert params.values.max_run_duration_seconds == 14400
    job = yaml.safe_load((CONFIG / "samples" / "kueue" / "queued" / "job.yaml").read_text())
    annotations = {k.removeprefix("provreq.kueue.x-k8s.io/"): v
                   for k, v in job["metadata"]["annotations"].items()}
    assert read_parameters(annotations, Mode.PROVISION, "queued").values \
        .max_run_duration_seconds == 7200


def test_kueue_path_b_uses_musters_admission_check_without_tas() -> None:
    objs = _by_kind(render(CONFIG / "samples" / "kueue" / "path-b"))
    checks = list(objs["AdmissionCheck"].values())
    assert [c["spec"]["controllerName"] for c in checks] == [
        load_config(CONFIG / "samples" / "kueue" / "muster-kueue.yaml").kueue.controller_name]
    assert not any(rf["spec"].get("topologyName") for rf in objs["ResourceFlavor"].values())
    assert "Topology" not in objs


def test_kueue_sample_jobs_target_the_sample_queues() -> None:
    for path in ("path-a", "path-b", "queued"):
        directory = CONFIG / "samples" / "kueue" / path
        job = yaml.safe_load((directory / "job.yaml").read_text())
        assert not schema_errors(job, "V1Job")
        objs = _by_kind(render(directory))
        queue = job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
        assert queue in objs["LocalQueue"], path
        assert objs["LocalQueue"][queue]["metadata"]["namespace"] == job["metadata"]["namespace"]
        assert job["spec"]["suspend"] is True


# ---------------------------------------------------------------- kubectl apply

def _builtin(group: str, plural: str, kind: str, namespaced: bool) -> ResourceType:
    return ResourceType(group=group, versions=("v1",), plural=plural, singular=kind.lower(),
                        kind=kind, namespaced=namespaced)


# The sandbox serves core/v1, coordination, DRA and CRDs, not apps/v1 or RBAC: serve those as
# plain stored types so kubectl can apply the Deployment and the RBAC objects. Their fields
# are checked against the Kubernetes types by test_every_kustomization_renders_to_valid_objects.
EXTRA_TYPES = [
    _builtin("apps", "deployments", "Deployment", True),
    _builtin("rbac.authorization.k8s.io", "clusterroles", "ClusterRole", False),
    _builtin("rbac.authorization.k8s.io", "clusterrolebindings", "ClusterRoleBinding", False),
    _builtin("rbac.authorization.k8s.io", "roles", "Role", True),
    _builtin("rbac.authorization.k8s.io", "rolebindings", "RoleBinding", True),
    _builtin("policy", "poddisruptionbudgets", "PodDisruptionBudget", True),
    _builtin("scheduling.k8s.io", "priorityclasses", "PriorityClass", False),
    # Stored, not enforced: the real tier (test_admission.py) is where the policies act.
    _builtin("admissionregistration.k8s.io", "validatingadmissionpolicies",
             "ValidatingAdmissionPolicy", False),
    _builtin("admissionregistration.k8s.io", "validatingadmissionpolicybindings",
             "ValidatingAdmissionPolicyBinding", False),
]


async def test_kubectl_applies_install_and_samples_to_the_api_sandbox(tmp_path: Path) -> None:
    server = SandboxServer(seed=7)
    for rt in EXTRA_TYPES:
        server.store.serve(rt)
    async with server:
        kc = server.write_kubeconfig(tmp_path / "kubeconfig")
        # The CRDs go in through the API, as on a real cluster: the sandbox starts without them.
        await kubectl_async(kc, "apply", "-k", str(CONFIG / "crds" / "provisioningrequest"))
        out = await kubectl_async(kc, "apply", "-k", str(CONFIG / "default"))
        assert "deployment.apps/muster created" in out
        assert "customresourcedefinition.apiextensions.k8s.io/capacitypools.muster.dev created" \
            in out
        out = await kubectl_async(kc, "apply", "-k", str(CONFIG / "samples"))
        assert "provisioningrequest.autoscaling.x-k8s.io/llm-train created" in out
        # Re-applying changes nothing: the manifests round-trip through the server unchanged.
        out = await kubectl_async(kc, "apply", "-k", str(CONFIG / "default"))
        # Except the PodDisruptionBudget, which this sandbox (serving it as a plain stored
        # type, without its schema) reports as configured again; not seen on a real server.
        out = "\n".join(line for line in out.splitlines()
                        if line != "poddisruptionbudget.policy/muster configured")
        assert "created" not in out and "configured" not in out, out
        pools = yaml.safe_load(await kubectl_async(kc, "get", "capacitypools", "-o", "yaml"))
        assert sorted(p["metadata"]["name"] for p in pools["items"]) == ["fake-cpu", "fake-h100"]
        pr = yaml.safe_load(await kubectl_async(
            kc, "get", "provreq", "llm-train", "-n", "muster-demo", "-o", "yaml"))
        assert pr["spec"]["podSets"][0]["count"] == 12
        cm = yaml.safe_load(await kubectl_async(
            kc, "get", "configmaps", "-n", NAMESPACE, "-o", "yaml"))
        assert len(cm["items"]) == 1
        # Kueue's wiring, against the stand-in Kueue CRDs (real Kueue: e2e/kind/run.sh).
        await kubectl_async(kc, "apply", "-f", str(KUEUE_CRDS))
        for sample in ("path-a", "path-b", "queued"):
            out = await kubectl_async(kc, "apply", "-k", str(CONFIG / "samples" / "kueue" / sample))
            assert "admissioncheck.kueue.x-k8s.io/" in out and "created" in out
        checks = yaml.safe_load(await kubectl_async(kc, "get", "admissionchecks", "-o", "yaml"))
        assert len(checks["items"]) == 3


async def test_samples_are_refused_before_the_crds_exist(tmp_path: Path) -> None:
    # The apply test above proves something only if the sandbox, like a cluster, refuses
    # custom objects whose CRD was not installed through the API first.
    async with SandboxServer(seed=7) as server:
        kc = server.write_kubeconfig(tmp_path / "kubeconfig")
        docs = render(CONFIG / "samples")
        with pytest.raises(AssertionError, match="could not find the requested resource"):
            await kubectl_async(kc, "apply", "-f", "-", stdin=yaml_dump(docs))


def test_kind_overlay_runs_muster_with_the_e2e_config(tmp_path: Path) -> None:
    docs = render(ROOT / "e2e" / "kind", "--load-restrictor=LoadRestrictionsNone")
    (cm,) = find(docs, "ConfigMap")
    text = cm["data"]["config.yaml"]
    assert text == (ROOT / "e2e" / "muster-e2e.yaml").read_text()
    (tmp_path / "config.yaml").write_text(text)
    load_config(tmp_path / "config.yaml")
    volumes = one(docs, "Deployment", "muster")["spec"]["template"]["spec"]["volumes"]
    assert {"name": cm["metadata"]["name"]} == next(
        v["configMap"] for v in volumes if "configMap" in v
    )
    # Everything else is config/default, unchanged, plus the fake provider's RBAC.
    base = {(d["kind"], d["metadata"]["name"]) for d in render(CONFIG / "default")}
    base |= {(d["kind"], d["metadata"]["name"]) for d in render(CONFIG / "rbac" / "fake-provider")}
    assert {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] != "ConfigMap"} == {
        k for k in base if k[0] != "ConfigMap"
    }
