"""The shell scripts CI and developers run (the test command, image build, helm and cluster
builds, lock refresh, CI entry point) parse with bash, pass shellcheck, are executable and fail
fast."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*ROOT.glob("hack/*.sh"), *ROOT.glob("hack/image/*.sh"),
                  *ROOT.glob("hack/cluster/*.sh"), ROOT / "hack" / "test", ROOT / ".ci" / "run"])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_script_is_sound(script: Path) -> None:
    assert os.access(script, os.X_OK), f"chmod +x {script}"
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing in CI; hack/test installs it with apt-get")
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck); bash -n ran")
    proc = subprocess.run([shellcheck, "--severity=style", str(script)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ci_runs_exactly_the_one_test_command() -> None:
    # CI and a newcomer run the same thing: every tool installed and every tier run by
    # hack/test, not by steps only CI takes.
    code = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    assert "hack/test" in code, code
    assert not [line for line in code if re.search(r"\b(pytest|pip|apt-get|build\.sh)\b", line)]
    test = (ROOT / "hack" / "test").read_text()
    for step in ("pip install", "apt-get install", "hack/cluster/build.sh",
                 "hack/install-helm.sh", '-m pytest -q "$@"'):
        assert step in test, step
