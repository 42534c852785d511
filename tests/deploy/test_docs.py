"""The documentation site builds and stays true to the code: ``mkdocs build --strict`` passes
(a broken link, a missing anchor or a page left out of the nav fails it), every condition,
reason, Event reason and metric the controller defines is on the reference pages, and every
``docs/...`` path the repository mentions exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from controller.cli import app as muster_app
from controller.commands.kubectl_plugin import app as kubectl_app
from controller.common.conditions import ConditionType, Reason
from controller.lifecycle import Phase

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONTROLLER = ROOT / "controller"


def _code(path: str) -> str:
    return (ROOT / path).read_text()


def _all_code() -> dict[Path, str]:
    return {p: p.read_text() for p in sorted(CONTROLLER.rglob("*.py"))}


def _missing(names: set[str], page: str) -> list[str]:
    text = (DOCS / page).read_text()
    return sorted(n for n in names if f"`{n}" not in text)


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--quiet",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    if "No module named mkdocs" in done.stderr:
        pytest.fail("mkdocs is not installed: pip install -e '.[dev]' (it is in the dev extra)")
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_every_request_condition_and_reason_is_on_the_conditions_page() -> None:
    names = {c.value for c in ConditionType} | {r.value for r in Reason}
    missing = _missing(names, "reference/conditions.md")
    assert not missing, (f"docs/reference/conditions.md lacks {missing} "
                         "(controller/common/conditions.py)")


def test_every_phase_is_on_the_conditions_page() -> None:
    names = {p.value for p in Phase if p.value} | {"Pending"}  # Phase.NEW is shown as Pending
    missing = _missing(names, "reference/conditions.md")
    assert not missing, f"docs/reference/conditions.md lacks the phases {missing}"


def test_every_pool_and_admission_check_reason_is_on_the_conditions_page() -> None:
    pool = _code("controller/state/pool_figures.py")
    names = set(re.findall(r'\((?:VALID|PROVIDER_READY|STOCK_OUT), "\w+",\s*"([A-Z]\w+)"', pool))
    names |= set(re.findall(r'^(?:VALID|PROVIDER_READY|STOCK_OUT) = "(\w+)"', pool, re.M))
    names |= set(
        re.findall(
            r'\(\s*"(?:True|False|Unknown)",\s*"([A-Z]\w+)"', _code("controller/kueue/workloads.py")
        )
    )
    assert {"Valid", "StockOut", "BadParametersRef"} <= names, "the reason patterns found nothing"
    missing = _missing(names, "reference/conditions.md")
    assert not missing, f"docs/reference/conditions.md lacks {missing}"


def test_every_event_reason_is_on_the_conditions_page() -> None:
    names: set[str] = set()
    for text in _all_code().values():
        names |= set(re.findall(r'"(?:Normal|Warning)",\s*"([A-Z]\w+)"', text))
    names -= {"Normal", "Warning"}
    assert {"ParametersIgnored", "GangPlaced"} <= names, "the Event pattern found nothing"
    missing = _missing(names, "reference/conditions.md")
    assert not missing, f"docs/reference/conditions.md lacks the Event reasons {missing}"


def test_every_metric_is_on_the_metrics_page() -> None:
    names: set[str] = set()
    for text in _all_code().values():
        names |= set(
            re.findall(
                r"(?:Counter|Gauge|Histogram|Summary|Info|Enum|GaugeMetricFamily|"
                r'CounterMetricFamily|HistogramMetricFamily)\(\s*"(muster_\w+)"',
                text,
            )
        )
    assert len(names) >= 10, f"the metric pattern found only {sorted(names)}"
    missing = _missing(names, "reference/metrics.md")
    assert not missing, f"docs/reference/metrics.md lacks {missing} (controller/common/metrics.py)"


def test_every_docs_path_the_repository_mentions_exists() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout.split()
    mentioned: dict[str, list[str]] = {}
    for name in tracked:
        if not name.endswith((".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".json")):
            continue
        path = ROOT / name
        if not path.is_file():
            continue
        for ref in re.findall(r"(?<![\w/.-])docs/[\w/.-]+\.(?:md|png|csv)", path.read_text()):
            mentioned.setdefault(ref, []).append(name)
    assert mentioned, "no docs/ path found anywhere: the pattern is wrong"
    missing = {ref: where for ref, where in mentioned.items() if not (ROOT / ref).is_file()}
    assert not missing, f"paths to pages that do not exist: {missing}"


def test_every_command_is_on_the_cli_page() -> None:
    page = (DOCS / "reference" / "cli.md").read_text()
    missing = []
    for prefix, app in (("muster", muster_app), ("kubectl muster", kubectl_app)):
        group = typer.main.get_command(app)
        names = sorted(getattr(group, "commands", {}))
        assert names, f"{prefix} has no subcommands: the lookup is wrong"
        missing += [f"{prefix} {n}" for n in names if f"`{prefix} {n}" not in page]
    assert not missing, f"docs/reference/cli.md lacks {missing}"
