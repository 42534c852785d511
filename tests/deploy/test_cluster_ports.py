"""Two real control planes on one machine (two clones, or two test runs in one clone) get their
own state directory and their own ports by default (e2e/cluster.py), without starting one.

Each test claims ports in a registry of its own (``MUSTER_CACHE``), so it sees no other run's
claims; ports actually in use on the machine are still skipped."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e import cluster as cp


@pytest.fixture(autouse=True)
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("MUSTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cp, "_SESSION", [])
    # session_cluster() exports its choice; none of it may outlive the test.
    saved = {
        k: os.environ.pop(k, None) for k in ("MUSTER_CLUSTER_STATE", "MUSTER_CLUSTER_PORT_BASE")
    }
    try:
        yield tmp_path / "cache" / "cluster-ports"
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def test_two_state_directories_get_their_own_ports_and_keep_them(tmp_path: Path) -> None:
    a, b = tmp_path / "clone-a" / ".cluster", tmp_path / "clone-b" / ".cluster"
    base_a, base_b = cp.port_base(a), cp.port_base(b)
    assert abs(base_a - base_b) >= cp.PORT_SLOT
    assert (cp.port_base(a), cp.port_base(b)) == (base_a, base_b)
    assert (a / "port-base").read_text() == f"{base_a}\n"


def test_the_slot_of_a_deleted_clone_is_reused(tmp_path: Path) -> None:
    gone = tmp_path / "gone" / ".cluster"
    base = cp.port_base(gone)
    (gone / "port-base").unlink()
    assert cp.port_base(tmp_path / "new" / ".cluster") == base


def test_ports_in_use_on_the_machine_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = cp.port_base(tmp_path / "first" / ".cluster")
    monkeypatch.setenv("MUSTER_CACHE", str(tmp_path / "another-registry"))
    with socket.socket() as other:  # something else listens inside that slot
        other.bind(("127.0.0.1", base + 5))
        other.listen()
        assert cp.port_base(tmp_path / "second" / ".cluster") != base


def test_the_environment_still_overrides_state_and_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: Path
) -> None:
    monkeypatch.setenv("MUSTER_CLUSTER_STATE", str(tmp_path / "mine"))
    monkeypatch.setenv("MUSTER_CLUSTER_PORT_BASE", "27100")
    assert cp.default_cluster() == cp.Cluster(tmp_path / "mine", cp.Ports(27100))
    assert not registry.exists(), "an explicit base claims nothing"
    monkeypatch.setenv("MUSTER_CLUSTER_PORT_BASE", "lots")
    with pytest.raises(cp.ClusterError, match="MUSTER_CLUSTER_PORT_BASE"):
        cp.default_cluster()


HOLDER = """
import json, sys
from pathlib import Path
from e2e import cluster as cp
cp.ROOT = Path(sys.argv[1])
cp.DEFAULT_STATE = cp.ROOT / ".cluster"
c = cp.session_cluster()
print(json.dumps([str(c.state), c.ports.base]), flush=True)
sys.stdin.read()
"""


def test_a_second_test_run_in_the_same_clone_gets_its_own_cluster(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clone = tmp_path / "clone"
    monkeypatch.setattr(cp, "ROOT", clone)
    monkeypatch.setattr(cp, "DEFAULT_STATE", clone / ".cluster")
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(clone)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(cp.__file__).resolve().parents[1])},
    )
    try:
        assert first.stdout is not None
        state, base = json.loads(first.stdout.readline())
        assert state == str(clone / ".cluster")
        second = cp.session_cluster()
        assert second.state == clone / ".cluster-2"
        assert abs(second.ports.base - base) >= cp.PORT_SLOT
        # Exported for every later lookup in this run (and the tools it starts).
        assert cp.default_cluster() == second
        assert os.environ["MUSTER_CLUSTER_STATE"] == str(second.state)
    finally:
        first.communicate(timeout=20)
    # Once the first run has ended, a new run takes .cluster again, on its old ports.
    monkeypatch.setattr(cp, "_SESSION", [])
    del os.environ["MUSTER_CLUSTER_STATE"], os.environ["MUSTER_CLUSTER_PORT_BASE"]
    assert cp.session_cluster() == cp.Cluster(clone / ".cluster", cp.Ports(base))
