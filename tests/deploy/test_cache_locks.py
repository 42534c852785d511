"""Two test runs on one machine share the build caches outside the clone: the scripts that fill
them (hack/cluster/build.sh, hack/install-helm.sh) take a lock, so a second build waits for the
first and then finds the cache complete instead of writing into it at the same time.

Each test holds the lock itself, as a running first build would, in a cache of its own
(``MUSTER_CLUSTER_CACHE``, ``MUSTER_CACHE``): no Go build runs."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "hack" / "cluster" / "build.sh"
HELM = ROOT / "hack" / "install-helm.sh"


@contextmanager
def held(lock: Path) -> Iterator[None]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def wait_for(what: str, probe: Callable[[], bool], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not probe():
        assert time.monotonic() < deadline, f"timed out after {within:g}s waiting for {what}"
        time.sleep(0.05)


def second_build(argv: list[str], env: dict[str, str], stderr: Path) -> subprocess.Popen[str]:
    # No go on PATH: the waiting build must find the cache complete, never start compiling.
    env = {**os.environ, **env, "PATH": "/usr/bin:/bin"}
    with stderr.open("w") as err:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env)


def cluster_cache_dir(root: Path) -> Path:
    versions = (ROOT / "hack" / "cluster" / "versions.env").read_bytes()
    key = hashlib.sha256(versions).hexdigest()[:12]
    version = next(
        line.split("=", 1)[1]
        for line in versions.decode().splitlines()
        if line.startswith("KUBERNETES_VERSION=")
    )
    return root / f"{version}-{key}"


def test_a_second_cluster_build_waits_for_the_first_and_finds_the_cache_complete(
    tmp_path: Path,
) -> None:
    out = cluster_cache_dir(tmp_path / "cache")
    stderr = tmp_path / "stderr"
    with held(Path(f"{out}.lock")):
        proc = second_build([str(BUILD)], {"MUSTER_CLUSTER_CACHE": str(tmp_path / "cache")}, stderr)
        wait_for("build.sh to say it waits", lambda: "waiting" in stderr.read_text())
        assert proc.poll() is None, "build.sh did not wait for the lock's holder"
        # What the first build leaves when it is done.
        (out / "bin").mkdir(parents=True)
        (out / ".complete").touch()
    stdout, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr.read_text()
    assert stdout.strip() == str(out / "bin")
    assert "the other build completed" in stderr.read_text()


def test_a_second_helm_build_waits_for_the_first_and_finds_helm_built(tmp_path: Path) -> None:
    version = "v0.0.0-test"
    target = tmp_path / "cache" / "helm" / version
    stderr = tmp_path / "stderr"
    with held(Path(f"{target}.lock")):
        proc = second_build(
            [str(HELM)], {"MUSTER_CACHE": str(tmp_path / "cache"), "HELM_VERSION": version}, stderr
        )
        wait_for("install-helm.sh to say it waits", lambda: "waiting" in stderr.read_text())
        assert proc.poll() is None, "install-helm.sh did not wait for the lock's holder"
        target.mkdir(parents=True)
        (target / "helm").write_text("#!/bin/sh\n")
        (target / "helm").chmod(0o755)
    stdout, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr.read_text()
    assert stdout.strip() == str(target / "helm")
    assert "the other build completed" in stderr.read_text()
