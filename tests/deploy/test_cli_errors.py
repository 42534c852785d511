"""A user's ordinary mistakes with the ``muster`` command, run as a user runs it (a separate
process): each one gets one line on stderr naming what is wrong, and exit code 2, never a
traceback. ``muster run``: a missing, broken, binary or non-kubeconfig kubeconfig, no
kubeconfig at all, an unknown context, ``--in-cluster`` outside a pod, a port already in use,
a non-UTF-8 config. ``muster fit``: binary, non-UTF-8, missing files and directories. And the
listen addresses of ``muster run`` are the configured ones."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from sandbox import SandboxServer
from tests.deploy.manifests import ROOT

SAMPLES = ROOT / "config" / "samples"
KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1"}
contexts:
- name: only
  context: {cluster: c, user: u}
current-context: only
users:
- name: u
  user: {token: t}
"""


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MUSTER_", "KUBERNETES_")) and k != "KUBECONFIG"}
    env.update(HOME=str(home), MUSTER_LEADER_ELECTION__ENABLED="false",
               MUSTER_SERVER__METRICS_SECURE="false")
    env.update(extra)
    return env


def _muster(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controller.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def files(tmp_path: Path) -> Iterator[dict[str, Path]]:
    out = {
        "binary": tmp_path / "binary.yaml",
        "latin1": tmp_path / "latin1.yaml",
        "broken": tmp_path / "broken.yaml",
        "not-a-kubeconfig": tmp_path / "hostname",
        "kubeconfig": tmp_path / "kubeconfig",
        "directory": tmp_path / "dir",
    }
    out["binary"].write_bytes(bytes(range(256)) * 4)
    out["latin1"].write_bytes("name: café\n".encode("latin-1"))
    out["broken"].write_text("clusters: [\n")
    out["not-a-kubeconfig"].write_text("build-host-7\n")
    out["kubeconfig"].write_text(KUBECONFIG)
    out["directory"].mkdir()
    yield out


@pytest.mark.parametrize(("args", "expected"), [
    (["--kubeconfig", "{missing}"], "error: --kubeconfig {missing}: no such file"),
    (["--kubeconfig", "{directory}"], "error: --kubeconfig {directory}: not a file"),
    (["--kubeconfig", "{broken}"], "error: --kubeconfig {broken}: not a usable kubeconfig"),
    (["--kubeconfig", "{not-a-kubeconfig}"],
     "error: --kubeconfig {not-a-kubeconfig}: not a usable kubeconfig"),
    (["--kubeconfig", "{binary}"], "error: --kubeconfig {binary}: not a text file (not UTF-8)"),
    (["--kubeconfig", "{latin1}"], "error: --kubeconfig {latin1}: not a text file (not UTF-8)"),
    (["--kubeconfig", "{kubeconfig}", "--context", "nope"],
     "error: --context nope: not in --kubeconfig {kubeconfig}"),
    ([], "error: no kubeconfig: ~/.kube/config does not exist; pass --kubeconfig, or "
     "--in-cluster in a pod"),
    (["--in-cluster"], "error: --in-cluster: not running in a Kubernetes pod"),
    (["--config", "{binary}"],
     "error: invalid configuration: {binary}: not a text file (not UTF-8); expected YAML"),
    (["--config", "{missing}"], "error: invalid configuration: {missing}: config file not found"),
])
def test_run_refuses_bad_start_up_input_in_one_line(
    tmp_path: Path, files: dict[str, Path], args: list[str], expected: str,
) -> None:
    names = {k: str(v) for k, v in files.items()} | {"missing": str(tmp_path / "none")}
    line = _one_line(_muster("run", *[a.format(**names) for a in args], env=_env(tmp_path)))
    assert line.startswith(expected.format(**names)), line


def test_a_kubeconfig_variable_naming_nothing_is_named(tmp_path: Path) -> None:
    line = _one_line(_muster("run", env=_env(tmp_path, KUBECONFIG=str(tmp_path / "kc"))))
    assert line == f"error: no kubeconfig: $KUBECONFIG ({tmp_path / 'kc'}) does not exist; " \
        "pass --kubeconfig, or --in-cluster in a pod"


@pytest.mark.parametrize(("which", "slot"), [
    ("binary", "request"), ("latin1", "--snapshot"), ("binary", "--pools"),
    ("broken", "request"), ("missing", "--snapshot"), ("directory", "--pools"),
])
def test_fit_refuses_unreadable_files_in_one_line(
    tmp_path: Path, files: dict[str, Path], which: str, slot: str,
) -> None:
    bad = str(files.get(which, tmp_path / "none"))
    args = {"request": str(SAMPLES / "fit-request.yaml"),
            "--snapshot": str(SAMPLES / "fit-cluster.yaml"),
            "--pools": str(SAMPLES / "fit-pools.yaml")}
    args[slot] = bad
    line = _one_line(_muster("fit", args["request"], "--snapshot", args["--snapshot"],
                             "--pools", args["--pools"], env=_env(tmp_path)))
    assert line.startswith(f"muster fit: {bad}: "), line


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    async with SandboxServer(crd_dir=ROOT / "crds") as server:
        kc = server.write_kubeconfig(tmp_path / "kubeconfig")
        with socket.socket() as taken:
            taken.bind(("0.0.0.0", 0))
            taken.listen()
            port = taken.getsockname()[1]
            env = _env(tmp_path, MUSTER_SERVER__PROBE_PORT=str(port),
                       MUSTER_SERVER__METRICS_PORT=str(_free_port()))
            done = await asyncio.to_thread(_muster, "run", "--kubeconfig", str(kc), env=env)
    line = _one_line(done)
    assert line == (f"error: server.probe_address 0.0.0.0 server.probe_port {port}: cannot "
                    "listen there (address already in use)"), line


async def test_run_listens_on_the_configured_addresses(tmp_path: Path) -> None:
    # 127.0.0.2 is loopback too on Linux: listening there, the probes do not answer on
    # 127.0.0.1 (as they would on the default 0.0.0.0).
    probe, metrics = _free_port("127.0.0.2"), _free_port("127.0.0.2")
    async with SandboxServer(crd_dir=ROOT / "crds") as server:
        kc = server.write_kubeconfig(tmp_path / "kubeconfig")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "controller.cli", "run", "--kubeconfig", str(kc), cwd=ROOT,
            env=_env(tmp_path, MUSTER_SERVER__PROBE_PORT=str(probe),
                     MUSTER_SERVER__METRICS_PORT=str(metrics),
                     MUSTER_SERVER__PROBE_ADDRESS="127.0.0.2",
                     MUSTER_SERVER__METRICS_ADDRESS="127.0.0.2"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            async with aiohttp.ClientSession() as session:
                status = None
                for _ in range(300):
                    try:
                        async with session.get(f"http://127.0.0.2:{probe}/healthz") as resp:
                            status = resp.status
                            break
                    except aiohttp.ClientError:
                        await asyncio.sleep(0.1)
                assert status == 200
                async with session.get(f"http://127.0.0.2:{metrics}/metrics") as resp:
                    assert resp.status == 200
                for port in (probe, metrics):
                    with pytest.raises(aiohttp.ClientConnectionError):
                        async with session.get(f"http://127.0.0.1:{port}/healthz"):
                            pass
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), timeout=30)
