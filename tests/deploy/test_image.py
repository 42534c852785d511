"""The container image, built for real from the Dockerfile and checked inside its own
filesystem.

No Docker engine runs on our machines and no image registry is reachable, so
``hack/build-image.sh`` builds the base layer from Debian packages (debootstrap, cached under
``~/.cache/muster/image/<key>``) and the Dockerfile on it with ``podman build --isolation
chroot`` (layers cached by podman). ``podman run`` cannot start containers here, so
``hack/image/run-in-image.sh`` runs commands in the image's filesystem the way a restricted
pod would: read-only root, a tmpfs at /tmp, the image's USER, WORKDIR and ENV.

Cold (nothing cached) the build takes minutes, and its progress is printed as it goes; warm
(nothing changed) it takes seconds. Nothing is skipped: a machine without podman, debootstrap
or root fails with what to install (``hack/test`` installs them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from controller import __version__
from tests.deploy import dockerfile
from tests.deploy.test_packaging import pins

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "hack" / "build-image.sh"
RUN_IN_IMAGE = ROOT / "hack" / "image" / "run-in-image.sh"
IMAGE = "localhost/muster:test"
MAX_SIZE_MB = 500
"""The image measured 429 MB (docs/benchmarks/image.md); matplotlib and numpy back in would pass
this."""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a cold build takes minutes


@dataclass(frozen=True)
class Built:
    name: str
    seconds: float
    cold: bool
    config: dict[str, Any]
    size: int


def _missing_tools() -> list[str]:
    needed = {"podman": "podman", "debootstrap": "debootstrap", "unshare": "util-linux",
              "chroot": "coreutils"}
    return sorted({pkg for tool, pkg in needed.items() if shutil.which(tool) is None})


@pytest.fixture(scope="session")
def image(request: pytest.FixtureRequest) -> Iterator[Built]:
    missing = _missing_tools()
    if missing:
        pytest.fail(
            f"building the image needs {', '.join(missing)}: apt-get install -y "
            f"{' '.join(missing)} (hack/test installs them)", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("building the image needs root (debootstrap, chroot builds, image "
                    "mounts); run the tests as root, as CI does", pytrace=False)
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")

    def say(line: str) -> None:  # live, past pytest's capture: a cold build takes minutes
        if reporter is None or capture is None:
            return
        with capture.global_and_fixture_disabled():
            reporter.ensure_newline()  # not after the progress dots
            reporter.write_line(line)

    started = time.monotonic()
    proc = subprocess.Popen(
        [str(BUILD)], env={**os.environ, "IMAGE": IMAGE}, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    log: list[str] = []
    cold = False
    for line in proc.stdout:
        log.append(line.rstrip())
        if "debootstrap" in line or "importing" in line:
            cold = True
        if line.startswith("muster-image:") or (cold and "STEP" in line and "RUN" in line):
            say(line.rstrip())
    code = proc.wait()
    assert code == 0, "hack/build-image.sh failed:\n" + "\n".join(log[-60:])
    seconds = time.monotonic() - started
    inspect = json.loads(_podman("image", "inspect", IMAGE))[0]
    built = Built(IMAGE, seconds, cold, inspect["Config"], int(inspect["Size"]))
    say(f"muster-image: {IMAGE} {built.size / 1e6:.0f} MB, build step {seconds:.0f} s "
        f"({'cold' if cold else 'warm'})")
    yield built
    subprocess.run(["podman", "image", "unmount", IMAGE], capture_output=True, check=False)


def _podman(*args: str) -> str:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=True,
                          timeout=120).stdout


def in_image(image: Built, *argv: str, timeout: float = 120,
             check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(RUN_IN_IMAGE), image.name, *argv], capture_output=True,
                          text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode} in the image:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def test_image_config_matches_the_dockerfile(image: Built) -> None:
    final = dockerfile.parse(ROOT / "Dockerfile").final
    assert image.config["User"] == final.all("USER")[-1].args == "65532:65532"
    assert image.config["Entrypoint"] == ["muster", "run"]
    assert image.config["Cmd"] == ["--in-cluster"]
    assert image.config["WorkingDir"] == "/tmp"
    assert {"8443/tcp", "8080/tcp"} <= set(image.config.get("ExposedPorts") or {})
    labels = image.config["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert len(labels["org.opencontainers.image.revision"]) == 40, "the commit built"
    assert image.size < MAX_SIZE_MB * 1e6, f"{image.size / 1e6:.0f} MB"


def test_runs_as_the_non_root_user_and_cannot_write_its_own_files(image: Built) -> None:
    out = in_image(image, "python3", "-c", (
        "import os, json; print(json.dumps([os.getuid(), os.getgid(), "
        "os.access('/opt/muster/lib', os.W_OK), os.access('/tmp', os.W_OK), "
        "os.stat('/opt/muster/bin/muster').st_uid]))"
    )).stdout
    assert json.loads(out) == [65532, 65532, False, True, 0]


def test_contains_the_crds(image: Built) -> None:
    listing = json.loads(in_image(image, "python3", "-c", (
        "import json; from controller.commands.crds import crd_dir; "
        "print(json.dumps({k: {p.name: p.read_text() for p in crd_dir(k).glob('*.yaml')} "
        "for k in ('crds', 'kueue-crds')}))"
    )).stdout)
    for kind, source in (("crds", ROOT / "crds"), ("kueue-crds", ROOT / "e2e" / "kueue-crds")):
        assert listing[kind] == {p.name: p.read_text() for p in source.glob("*.yaml")}, kind


def test_contains_exactly_the_locked_dependencies(image: Built) -> None:
    script = (
        "import json, platform, importlib.metadata as m\n"
        "print(json.dumps([platform.python_version(), {d.metadata['Name']: "
        "[d.version, d.requires or []] for d in m.distributions()}]))"
    )
    python, found = json.loads(in_image(image, "python3", "-c", script).stdout)
    installed = {canonicalize_name(k): v for k, v in found.items()}
    venv = {name: version for name, (version, _) in installed.items()}
    locked = {name: version for name, (version, _) in pins(ROOT / "requirements.lock").items()}
    # Exactly the lock plus Muster: no pip, no setuptools, no matplotlib, no dev tools.
    assert venv.pop("muster") == __version__
    assert venv == locked
    # And each one's own requirements are met (what `pip check` would say).
    env = {**default_environment(), "python_full_version": python,
           "python_version": ".".join(python.split(".")[:2]), "extra": ""}
    unmet = []
    for name, (_, requires) in installed.items():
        for spec in requires:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            have = venv.get(canonicalize_name(req.name))
            if have is None or not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{name} needs {spec}, has {have}")
    assert not unmet, unmet


def test_muster_version_and_run_help(image: Built) -> None:
    assert in_image(image, "muster", "--version").stdout == f"{__version__}\n"
    help_text = in_image(image, "muster", "run", "--help").stdout
    assert "--in-cluster" in help_text and "--config" in help_text


def test_simulate_names_the_extra_the_image_leaves_out(image: Built) -> None:
    proc = in_image(image, "muster", "simulate", "--trace", "/nonexistent.csv", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: muster simulate needs the 'simulate' extra (matplotlib): "
        "pip install 'muster[simulate]'"
    ]
    assert "No module named" not in proc.stderr


def test_demo_runs_end_to_end_in_the_image(image: Built) -> None:
    # The sandbox, controller, fake provider and scheduler, as uid 65532 on a
    # read-only root: what `muster run` needs at start-up is exercised too.
    proc = in_image(image, "muster", "demo", "--timeout", "90", timeout=180)
    assert "demo finished" in proc.stdout, proc.stdout[-2000:]
