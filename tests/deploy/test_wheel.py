"""A non-editable install carries what ``muster demo`` needs: the wheel built from this tree
(``pip wheel``, as ``pip install .`` builds it) installs the CRDs under
``<venv>/share/muster/``, and ``muster demo`` run from the venv, outside any checkout, loads
them from there and runs the gang to the end.

The wheel is installed without dependencies, which the venv then finds where the interpreter
running the tests has them (its site-packages directories: a virtualenv's, the system's or the
user's), so nothing is downloaded and the test stays bounded; the assertions check that Muster
itself is the wheel's copy, not this checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.manifests import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SKIP = shutil.ignore_patterns(".git", ".cluster", "build", "dist", "*.egg-info", "__pycache__",
                              ".*_cache", ".hypothesis", ".venv", "artifacts")


def _run(*args: str | Path, cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"{args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _see_the_running_interpreters_packages(python: Path) -> None:
    """Muster's dependencies, from wherever this interpreter has them: a ``.pth`` file in the
    venv lists this interpreter's site-packages directories after the venv's own, so the
    wheel's copy of Muster comes first. Only the directories are added, not the ``.pth`` files
    in them, so an editable install of this checkout there stays inactive."""
    dirs = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")
            and Path(p).is_dir()]
    assert dirs, f"no site-packages directory on this interpreter's path: {sys.path}"
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                   cwd=python.parent).strip()
    (Path(purelib) / "test-environment.pth").write_text("\n".join(dirs) + "\n")


def test_muster_demo_runs_from_a_wheel_install(tmp_path: Path) -> None:
    # A copy of the tree, so building leaves no build/ or egg-info in the checkout.
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=SKIP)
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", tmp_path / "dist", source, cwd=tmp_path)
    wheels = list((tmp_path / "dist").glob("muster-*.whl"))
    assert len(wheels) == 1, wheels
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheels[0],
         cwd=tmp_path)
    _see_the_running_interpreters_packages(python)
    shutil.rmtree(source)  # nothing may come from the tree the wheel was built from
    where = _run(python, "-c", "import controller, controller.commands.crds as c; "
                 "print(controller.__file__); print(c.crd_dir()); print(c.crd_dir('kueue-crds'))",
                 cwd=tmp_path).split()
    assert Path(where[0]).is_relative_to(venv), f"controller imported from {where[0]}"
    assert Path(where[1]) == venv / "share" / "muster" / "crds"
    assert Path(where[2]) == venv / "share" / "muster" / "kueue-crds"
    assert {p.name for p in Path(where[1]).glob("*.yaml")} == {
        p.name for p in (ROOT / "crds").glob("*.yaml")}
    out = _run(venv / "bin" / "muster", "demo", "--latency", "0", "--ready-delay", "0.2",
               cwd=tmp_path)
    assert "every pod is bound" in out, out
