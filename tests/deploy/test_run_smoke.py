"""What the Deployment runs, run here: ``muster run --config config/manager/muster.yaml``
as a separate process against the API sandbox, with the ports moved by ``MUSTER_*`` variables
(as a pod's env would). The probe endpoint answers, metrics are served, logs are JSON lines
as the shipped config asks, SIGTERM (what the kubelet sends) stops it cleanly, and a bad
config stops it at start-up naming the key."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp

from sandbox import SandboxServer
from tests.deploy.manifests import CONFIG, ROOT

SHIPPED_CONFIG = CONFIG / "manager" / "muster.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(probe: int, metrics: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
    env.update(MUSTER_SERVER__PROBE_PORT=str(probe), MUSTER_SERVER__METRICS_PORT=str(metrics))
    return env


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str] | None:
    try:
        async with session.get(url) as resp:
            return resp.status, await resp.text()
    except aiohttp.ClientError:
        return None


async def test_shipped_config_runs_probes_metrics_and_stops_on_sigterm(tmp_path: Path) -> None:
    probe, metrics = _free_port(), _free_port()
    async with SandboxServer(crd_dir=ROOT / "crds", seed=5) as server:
        kc = server.write_kubeconfig(tmp_path / "kubeconfig")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "controller.cli", "run", "--config", str(SHIPPED_CONFIG),
            "--kubeconfig", str(kc), cwd=ROOT, env=_env(probe, metrics),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with aiohttp.ClientSession() as session:
                healthy = None
                for _ in range(300):
                    healthy = await _get(session, f"http://127.0.0.1:{probe}/healthz")
                    if (healthy and healthy[0] == 200) or proc.returncode is not None:
                        break
                    await asyncio.sleep(0.1)
                assert healthy and healthy[0] == 200, f"/healthz never answered 200: {healthy}"
                got = await _get(session, f"http://127.0.0.1:{metrics}/metrics")
                assert got and got[0] == 200, got
                # The controller's registry (a gauge per phase) and the process collector.
                assert 'muster_requests{phase="Pending"} 0.0' in got[1], got[1]
                assert "process_resident_memory_bytes " in got[1], got[1]
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), timeout=20)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.stdout is not None
        output = (await proc.stdout.read()).decode()
    assert code == 0, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines, "Muster logged nothing"
    for line in lines:
        record = json.loads(line)  # log_format: json in the shipped config
        assert {"ts", "level", "msg"} <= record.keys()
    assert any("Muster is running" in json.loads(line)["msg"] for line in lines)
    assert not any("GET /healthz" in line for line in lines), "probes must not flood the log"


async def test_bad_config_stops_muster_at_start_up(tmp_path: Path) -> None:
    bad = tmp_path / "muster.yaml"
    bad.write_text(SHIPPED_CONFIG.read_text() + "booking:\n  duration_secs: 5\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controller.cli", "run", "--config", str(bad),
        "--kubeconfig", str(tmp_path / "none"), cwd=ROOT, env=_env(_free_port(), _free_port()),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2
    assert "duration_secs" in err.decode()
