"""``python3 -m sandbox`` serves until interrupted, writes a kubeconfig, loads CRDs, and
reports a missing CRD directory as an error instead of a traceback."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.sandbox.conftest import CRDS, ROOT

pytestmark = pytest.mark.timeout(30)


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as resp:  # loopback only
        return dict(json.loads(resp.read()))


async def test_cli_serves_crds_and_writes_kubeconfig_until_interrupted(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sandbox", "--kubeconfig", str(kubeconfig), "--crds", str(CRDS),
        "--scheduler", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        lines = [await asyncio.wait_for(proc.stdout.readline(), 15) for _ in range(2)]
        assert b"listening on http://127.0.0.1:" in lines[1]
        server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        group = await asyncio.to_thread(_get, f"{server}/apis/autoscaling.x-k8s.io")
        assert group["name"] == "autoscaling.x-k8s.io"
    finally:
        proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), 10)
    assert code == 0


async def test_cli_reports_a_missing_crd_directory(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sandbox", "--crds", str(tmp_path / "missing"), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 2
    assert b"error: CRD directory" in out and b"Traceback" not in out
