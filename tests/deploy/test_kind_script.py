"""e2e/kind/run.sh: no Docker engine or kind runs here, so the script is checked by bash -n,
shellcheck, and by running it for real against stand-in ``docker``/``kind``/``kubectl``/
``python3`` commands that record their arguments. That proves the order of the steps, that
the suite gets the kubeconfig of the cluster it created, that logs are collected when a
step fails, and that the cluster is deleted (unless KEEP_CLUSTER=1) whatever happens.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "e2e" / "kind" / "run.sh"
BASH = shutil.which("bash") or "/bin/bash"

STUB = """#!{bash}
echo "{name} $*" >> "$CALLS"
if [[ -n "${{FAIL_ON:-}}" && "{name} $*" == *"$FAIL_ON"* ]]; then exit 1; fi
case "{name} $*" in
  "kubectl apply"*) while read -r _; do :; done ;;
  "kubectl kustomize"*) echo "kind: Deployment" ;;
esac
exit 0
"""


def test_bash_parses_the_script() -> None:
    proc = subprocess.run([BASH, "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    text = SCRIPT.read_text()
    assert "set -euo pipefail" in text
    assert os.access(SCRIPT, os.X_OK), "run.sh must be executable"
    assert re.search(r"KUEUE_VERSION=\$\{KUEUE_VERSION:-v\d+\.\d+\.\d+\}", text), (
        "Kueue's release must be pinned (and overridable)"
    )


def test_shellcheck_is_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing in CI; hack/test installs it with apt-get")
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck); bash -n ran")
    proc = subprocess.run(
        [shellcheck, "--severity=style", str(SCRIPT)], capture_output=True, text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_suite_option_exists() -> None:
    conftest = (ROOT / "e2e" / "conftest.py").read_text()
    assert '"--kubeconfig"' in conftest, "run.sh passes --kubeconfig to pytest"
    assert (ROOT / "e2e" / "muster-e2e.yaml").is_file(), "e2e/kind installs Muster with it"


def _run(
    tmp_path: Path, *, without: str = "", **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("docker", "kind", "kubectl", "python3", "git"):
        if name == without:
            continue
        path = stubs / name
        path.write_text(STUB.format(bash=BASH, name=name))
        path.chmod(0o755)
    for tool in ("dirname", "mkdir", "grep"):
        real = shutil.which(tool)
        assert real is not None
        (stubs / tool).symlink_to(real)
    calls = tmp_path / "calls.txt"
    calls.touch()
    proc = subprocess.run(
        [BASH, str(SCRIPT), "-k", "smoke"],
        env={"PATH": str(stubs), "CALLS": str(calls), "ARTIFACTS": str(tmp_path / "art"),
             "HOME": str(tmp_path), **env},
        capture_output=True, text=True, timeout=60, check=False,
    )
    return proc, calls.read_text().splitlines()


def _index(calls: list[str], prefix: str) -> int:
    for i, call in enumerate(calls):
        if call.startswith(prefix):
            return i
    raise AssertionError(f"{prefix!r} never ran; calls:\n" + "\n".join(calls))


def test_steps_run_in_order_and_the_cluster_is_deleted(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    kubeconfig = str(tmp_path / "art" / "kubeconfig")
    order = [
        f"kind create cluster --name muster-e2e --kubeconfig {kubeconfig}",
        "docker build --tag muster:dev",
        "kind load docker-image muster:dev --name muster-e2e",
        f"kubectl apply --server-side -k {ROOT}/config/crds/provisioningrequest",
        "kubectl apply --server-side -f https://github.com/kubernetes-sigs/kueue/releases/"
        "download/v",
        "kubectl -n kueue-system wait deployment/kueue-controller-manager",
        f"kubectl kustomize --load-restrictor=LoadRestrictionsNone {ROOT}/e2e/kind",
        "kubectl -n muster-system rollout status deployment/muster",
        f"python3 -m pytest e2e -m real --kubeconfig {kubeconfig} -q -k smoke",
        "kind delete cluster --name muster-e2e",
    ]
    positions = [_index(calls, step) for step in order]
    assert positions == sorted(positions), "\n".join(calls)
    assert not any("logs" in c for c in calls), "no log collection on success"


def test_a_failing_suite_collects_logs_and_still_deletes_the_cluster(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, FAIL_ON="python3 -m pytest")
    assert proc.returncode == 1
    assert "e2e FAILED" in proc.stderr
    _index(calls, "kubectl -n muster-system logs -l app.kubernetes.io/name=muster --prefix")
    _index(calls, "kind export logs")
    assert calls[-1] == "kind delete cluster --name muster-e2e"
    assert (tmp_path / "art" / "muster.log").exists()


def test_a_failing_install_stops_before_the_suite(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, FAIL_ON="rollout status")
    assert proc.returncode == 1
    assert not any(c.startswith("python3 -m pytest") for c in calls)
    assert calls[-1] == "kind delete cluster --name muster-e2e"


def test_keep_cluster_keeps_it(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, KEEP_CLUSTER="1")
    assert proc.returncode == 0, proc.stderr
    assert not any(c.startswith("kind delete") for c in calls)
    assert "keeping cluster muster-e2e" in proc.stderr


def test_missing_tool_is_a_clear_error(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, without="kind")
    assert proc.returncode == 2
    assert "error: kind is required" in proc.stderr
    assert not any(c.startswith("kind") for c in calls)
