"""The threaded runner serves synchronous callers: HTTP from the test thread, store access
marshalled onto the sandbox loop, the scheduler running in the background."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from sandbox import ApiError
from sandbox.thread import ThreadedSandbox
from tests.sandbox.conftest import CRDS

pytestmark = pytest.mark.timeout(30)


def test_threaded_sandbox_serves_sync_callers_and_schedules(tmp_path: Path) -> None:
    with ThreadedSandbox(crd_dir=CRDS, scheduler=True, seed=1) as sb:
        assert sb.write_kubeconfig(tmp_path / "kc").exists()
        with urllib.request.urlopen(f"{sb.url}/apis/autoscaling.x-k8s.io", timeout=5) as r:
            assert json.loads(r.read())["name"] == "autoscaling.x-k8s.io"
        sb.call(sb.store.create, "nodes", {
            "metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]}})
        sb.call(sb.store.create, "pods", {"metadata": {"name": "p"},
                                          "spec": {"containers": [{"name": "c"}]}})
        deadline = time.monotonic() + 5
        while sb.call(sb.store.get, "pods", "p")["spec"].get("nodeName") != "n1":
            assert time.monotonic() < deadline, "the pod was not scheduled"
            time.sleep(0.02)
        with pytest.raises(ApiError):
            sb.call(sb.store.get, "pods", "missing")
    with pytest.raises(RuntimeError):
        _ = sb.url
