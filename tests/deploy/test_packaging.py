"""What goes into the image, checked from the repository: the lock files pin every runtime
dependency (and nothing of the extras) with hashes, the plotting library is an extra that
``muster simulate`` names when missing, the CRDs travel in the wheel, and the version is one.

tests/deploy/test_image.py builds the image from these and checks the result.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from typer.testing import CliRunner

from controller import __version__
from controller.cli import app
from controller.commands.crds import crd_dir

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a pip-compile --generate-hashes file."""
    out: dict[str, tuple[str, list[str]]] = {}
    text = lock.read_text()
    for match in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)((?: \\\n\s+--hash=sha256:[0-9a-f]{64})+)",
                             text, re.M):
        hashes = re.findall(r"sha256:([0-9a-f]{64})", match.group(3))
        out[canonicalize_name(match.group(1))] = (match.group(2), hashes)
    entries = re.findall(r"^[A-Za-z0-9_.-]+==", text, re.M)
    assert len(entries) == len(out), f"{lock.name}: an entry without hashes"
    return out


@pytest.fixture(scope="module")
def runtime_lock() -> dict[str, tuple[str, list[str]]]:
    return pins(ROOT / "requirements.lock")


def test_lock_pins_every_runtime_dependency_within_its_range(
    runtime_lock: dict[str, tuple[str, list[str]]],
) -> None:
    for spec in PROJECT["dependencies"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in runtime_lock, f"requirements.lock lacks {req.name}: run hack/lock.sh"
        version = runtime_lock[name][0]
        assert req.specifier.contains(version, prereleases=True), (
            f"requirements.lock pins {req.name}=={version}, outside {req.specifier}: "
            "run hack/lock.sh"
        )


def test_lock_leaves_extras_out(runtime_lock: dict[str, tuple[str, list[str]]]) -> None:
    extras = PROJECT["optional-dependencies"]
    assert [Requirement(r).name for r in extras["simulate"]] == ["matplotlib"]
    for name in ("matplotlib", "numpy", "pytest", "moto", "ruff", "mypy", "pip-tools"):
        assert canonicalize_name(name) not in runtime_lock, f"{name} must stay out of the image"
    assert "muster[simulate]" in extras["dev"], "the tests plot, so dev includes simulate"


def test_build_lock_has_the_build_backend() -> None:
    build = pins(ROOT / "requirements-build.lock")
    backend = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for spec in backend:
        req = Requirement(spec)
        version = build[canonicalize_name(req.name)][0]
        assert req.specifier.contains(version), f"{req.name}=={version} outside {req.specifier}"


def test_without_the_simulate_extra_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n")
    result = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--no-plot"])
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        "error: muster simulate needs the 'simulate' extra (matplotlib): "
        "pip install 'muster[simulate]'"
    ]


def test_version_is_one() -> None:
    assert PROJECT["version"] == __version__
    for args in (["--version"], ["version"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0
        assert result.output == f"{__version__}\n"


def test_the_wheel_carries_the_crds() -> None:
    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "data-files"]
    assert files == {"share/muster/crds": ["crds/*.yaml"],
                     "share/muster/kueue-crds": ["e2e/kueue-crds/*.yaml"]}
    # In a checkout the demo reads the repository's own files.
    assert crd_dir() == ROOT / "crds"
    assert crd_dir("kueue-crds") == ROOT / "e2e" / "kueue-crds"
