"""The real control plane's optional knobs (e2e/cluster.py), without starting it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

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


def _tree(path: Path) -> dict[str, bytes | None]:
    """Every file under ``path`` with its contents (directories as None); empty if absent."""
    if not path.exists():
        return {}
    return {str(p): None if p.is_dir() else p.read_bytes() for p in [path, *path.rglob("*")]}


def test_kueue_gets_its_metrics_certificate_from_the_state_directory_not_the_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every `up` used to write the machine-wide /etc/kueue/metrics/certs, shared by all the
    # clusters on the machine. Here up's Kueue step runs with a stand-in for Kueue that
    # reports the certificate it finds at Kueue's fixed path.
    etc_kueue = cp.KUEUE_METRICS_CERTS.parents[1]
    before = _tree(etc_kueue)
    state = tmp_path / "state"
    cluster = cp.Cluster(state=state, ports=cp.Ports(1))
    pki = state / "pki"
    pki.mkdir(parents=True)
    (pki / "kueue-webhook.crt").write_text(f"certificate of {state}\n")
    (pki / "kueue-webhook.key").write_text("key\n")
    (pki / "ca.crt").write_text("ca\n")
    bin_dir = tmp_path / "cache" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir.parent / "kueue-webhooks.yaml").write_text("")
    seen = state / "kueue-saw"
    kueue = bin_dir / "kueue"
    kueue.write_text(f"#!/bin/sh\ncat {cp.KUEUE_METRICS_CERTS}/tls.crt > {seen}.tmp\n"
                     f"mv {seen}.tmp {seen}\n")
    kueue.chmod(0o755)
    monkeypatch.setattr(cp, "kubectl", lambda *a, **k: None)
    monkeypatch.setattr(cp, "_wait", lambda *a, **k: None)

    cp._start_kueue(cluster, bin_dir, pki)
    deadline = time.monotonic() + 20
    while not seen.exists():
        assert time.monotonic() < deadline, (
            "timed out after 20s waiting for the stand-in Kueue to read its certificate; its "
            f"log:\n{cp._log_tail(cluster, 'kueue')}")
        time.sleep(0.05)
    assert seen.read_text() == f"certificate of {state}\n"
    assert _tree(etc_kueue) == before, f"{etc_kueue} changed on the machine"
    cp._stop(cluster, "kueue")


@pytest.mark.parametrize(("select", "builds"), [(["-m", "not real"], False), ([], True)])
def test_only_a_run_that_selects_a_real_tier_test_builds_the_control_plane(
    tmp_path: Path, select: list[str], builds: bool,
) -> None:
    # The fast local loop (-m "not real") started the real control plane's build (tens of
    # minutes cold): the build hook looked at the tests before -m deselected them.
    (tmp_path / "test_tiers.py").write_text(
        "import pytest\n\n\n@pytest.mark.real\ndef test_real():\n    pass\n\n\n"
        "def test_sandbox():\n    pass\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "go-was-called"
    (bin_dir / "go").write_text(f"#!/bin/sh\ntouch {called}\nexit 1\n")
    (bin_dir / "go").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(cp.ROOT),
           "MUSTER_CLUSTER_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "e2e.real",
         *select, str(tmp_path / "test_tiers.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert called.exists() == builds, done.stdout + done.stderr
