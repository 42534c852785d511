"""The README's install section, run block by block on a bare real control plane.

A user installs Muster from the clone with the commands under "Install". This
test runs those fenced blocks (each marked ``<!-- install-step: NAME -->`` in README.md) with
bash, unchanged, against a control plane of its own that has nothing of Muster on it: the
kustomize path, then the Helm path, each with the samples and the uninstall. What this
machine cannot do is stood in for, as docs/tasks/install.md says: the image is never pulled
(kwok only marks the Deployment's pods Running on a node it fakes), so the controller runs as
``muster run`` with the installed ServiceAccount's token and the installed ConfigMap's config file.
Everything else is the real thing: Pod Security admission of the Deployment's pods, RBAC,
the admission policies, the PriorityClass and PodDisruptionBudget, the uninstall's cleanup.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import cluster as cp
from e2e import rbac_audit
from e2e.real import MusterProcess, forbidden

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"<!-- install-step: ([a-z-]+) -->\n```bash\n(.*?)\n```", re.S)
# Not pushed anywhere and never pulled: kwok does not run containers.
IMAGE_ENV = {"REGISTRY": "registry.invalid/e2e", "TAG": "install-test"}


def readme_steps() -> dict[str, str]:
    return dict(STEP.findall((ROOT / "README.md").read_text()))


def test_the_readme_marks_every_install_step() -> None:
    assert set(readme_steps()) == {
        "crd", "kustomize", "helm", "samples", "uninstall-samples", "uninstall-kustomize",
        "uninstall-helm"}


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cp.Cluster]:
    """A control plane beside the tier's (its own ports and state), with nothing installed."""
    base = cp.default_cluster().ports.base + 40
    cluster = cp.Cluster(state=tmp_path_factory.mktemp("bare-cluster"), ports=cp.Ports(base))
    try:
        cp.up(cluster, bare=True)
    except cp.ClusterError as exc:
        pytest.fail(f"the bare control plane did not start: {exc}", pytrace=False)
    # The node the Deployment's pods land on (kwok plays its kubelet).
    cp.kubectl(cluster, "apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "install-test-node",
                     "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"kubernetes.io/os": "linux",
                                "kubernetes.io/hostname": "install-test-node"}},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                   "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"}},
    }))
    yield cluster
    cp.down(cluster)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of what the install reads (the README's commands run from the clone's root)."""
    for part in ("config", "charts"):
        shutil.copytree(ROOT / part, tmp_path / part)
    return tmp_path


def run_step(name: str, cluster: cp.Cluster, workdir: Path) -> str:
    helm = Path(cp.helm_binary())
    env = {**os.environ, **IMAGE_ENV, "KUBECONFIG": str(cluster.admin_kubeconfig),
           "PATH": f"{helm.parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_steps()[name]],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f"README install step {name!r} failed (exit {done.returncode}):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def kubectl_json(cluster: cp.Cluster, *args: str) -> Any:
    return json.loads(cp.kubectl(cluster, "get", *args, "-o", "json").stdout)


def installed_muster(cluster: cp.Cluster, workdir: Path) -> MusterProcess:
    """``muster run`` as the installed Deployment's container would run it: its
    ServiceAccount's token and the config file of its ConfigMap."""
    deployment = kubectl_json(cluster, "deployment", "muster", "-n", cp.MUSTER_NAMESPACE)
    pod_spec = deployment["spec"]["template"]["spec"]
    account = pod_spec["serviceAccountName"]
    config_map = next(v["configMap"]["name"] for v in pod_spec["volumes"] if "configMap" in v)
    data = kubectl_json(cluster, "configmap", config_map, "-n", cp.MUSTER_NAMESPACE)["data"]
    config = workdir / "installed-config.yaml"
    config.write_text(next(iter(data.values())))
    cp.token_kubeconfig(cluster, cluster.muster_kubeconfig, account, cp.MUSTER_NAMESPACE)
    # The e2e defaults of MusterProcess, except what a user's install does not have: the
    # Kueue check's rights (config/rbac/kueue) are not part of it.
    return MusterProcess(cluster, config=config, extra_env={"MUSTER_KUEUE__ENABLED": "false"})


def assert_deployment_admitted(cluster: cp.Cluster) -> None:
    pods = kubectl_json(cluster, "pods", "-n", cp.MUSTER_NAMESPACE)["items"]
    assert len(pods) == 2, pods
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["priorityClassName"]
    namespace = kubectl_json(cluster, "namespace", cp.MUSTER_NAMESPACE)
    assert namespace["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "restricted"
    assert kubectl_json(cluster, "pdb", "-n", cp.MUSTER_NAMESPACE)["items"]


def provision_samples(cluster: cp.Cluster, workdir: Path) -> None:
    """The samples provisioned and removed again while the installed Muster runs."""
    muster = installed_muster(cluster, workdir)
    muster.start()
    try:
        out = run_step("samples", cluster, workdir)
        details = json.loads(out.strip().splitlines()[-1])
        assert details.get("topology.muster.dev/rack"), details
        run_step("uninstall-samples", cluster, workdir)
    finally:
        code = muster.stop()
    lines = muster.new_lines()
    assert code == 0, muster.tail()
    assert not forbidden(lines), forbidden(lines)[:5]
    assert "Traceback" not in "\n".join(lines), muster.tail()


def assert_removed(cluster: cp.Cluster) -> None:
    for kind, name in (("clusterrole", "muster"), ("crd", "capacitypools.muster.dev"),
                       ("priorityclass", "muster-controller"),
                       ("validatingadmissionpolicy", "muster-capacitypools")):
        assert cp.kubectl(cluster, "get", kind, name, check=False).returncode != 0, (kind, name)
    cp.kubectl(cluster, "wait", "--for=delete", f"namespace/{cp.MUSTER_NAMESPACE}",
               "namespace/muster-demo", "--timeout=120s", check=False)
    names = [n["metadata"]["name"] for n in kubectl_json(cluster, "nodes")["items"]]
    assert names == ["install-test-node"], f"nodes left behind: {names}"
    usage = rbac_audit.read(cluster.audit_log)
    assert not usage.refused, rbac_audit.report(usage, rbac_audit.granted())


@pytest.mark.parametrize("tool", ["kustomize", "helm"])
def test_the_readme_install_works(tool: str, bare: cp.Cluster, workdir: Path) -> None:
    run_step("crd", bare, workdir)
    run_step(tool, bare, workdir)
    assert_deployment_admitted(bare)
    provision_samples(bare, workdir)
    run_step(f"uninstall-{tool}", bare, workdir)
    assert_removed(bare)
