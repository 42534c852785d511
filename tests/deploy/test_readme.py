"""The README and the documentation pages stay true: the README's fresh-machine commands are
untouched and it stays short, the configuration reference lists every setting of the config
model, the dependency page covers every dependency in pyproject.toml, and the commands the
install pages give name paths that exist."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from pydantic import BaseModel

from controller.config import MusterConfig

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"

FRESH_MACHINE = (
    "pip install -e '.[dev]' && muster demo      # the controller, API sandbox and fake "
    "provider in one process\n"
    "hack/test                                   # installs what the tests need (cached), "
    "then runs every tier\n"
)
MAX_README_LINES = 300


def _settings(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _settings(ann, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def _page(path: str) -> str:
    page = DOCS / path
    assert page.is_file(), f"docs/{path} is missing"
    return page.read_text()


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section {title!r}"
    return match.group(1)


def test_fresh_machine_commands_are_the_first_lines() -> None:
    assert README.startswith("# Muster\n\n```bash\n" + FRESH_MACHINE + "```\n")


def test_the_readme_stays_a_front_door() -> None:
    lines = README.count("\n")
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail to a page "
        "under docs/ and link to it"
    )


def test_configuration_reference_lists_every_setting() -> None:
    table = _page("reference/config.md")
    listed = set(re.findall(r"^\| `([a-z_.]+)` \|", table, re.M))
    missing = set(_settings(MusterConfig)) - listed
    assert not missing, (
        f"docs/reference/config.md lacks {sorted(missing)}: run "
        "python3 hack/config_reference.py --write"
    )
    stale = listed - set(_settings(MusterConfig))
    assert not stale, (
        f"docs/reference/config.md lists settings that no longer exist: {sorted(stale)}"
    )
    unexplained = re.findall(r"^\| `([a-z_.]+)` \|.*\|\s*\|$", table, re.M)
    assert not unexplained, (
        f"settings without a description (Field(description=...)): {unexplained}"
    )


def test_dependency_page_explains_every_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [spec for specs in project["optional-dependencies"].values() for spec in specs]
    names = [
        re.split(r"[<>=\[ ;]", spec, maxsplit=1)[0].lower()
        for spec in project["dependencies"] + extras
    ]
    names = [n for n in names if n != project["name"]]  # dev pulls in muster[simulate]
    table = _page("dependencies.md")
    explained = {
        m.lower()
        for m in re.findall(r"^\| ([A-Za-z0-9_.-]+)(?: \((?:dev|simulate)\))? \|", table, re.M)
    }
    # Type stubs need no explanation of their own.
    missing = [n for n in names if n not in explained and not n.startswith("types-")]
    assert not missing, f"docs/dependencies.md lacks {missing}"
    assert "kopf" in table, "docs/dependencies.md no longer says why there is no kopf"


def test_paths_in_install_and_e2e_pages_exist() -> None:
    text = (
        _section(README, "Install")
        + _page("tasks/install.md")
        + _page("testing/kind.md")
        + _page("tasks/kueue.md")
    )
    paths = set(re.findall(r"`((?:config|e2e|hack)/[\w./-]+)`", text))
    paths |= set(re.findall(r"(?:-k|bash) ((?:config|e2e)/[\w./-]+)", text))
    assert paths
    # artifacts/ is where run.sh writes logs; it exists only after a run.
    missing = sorted(p for p in paths if not (ROOT / p).exists() and p != "e2e/kind/artifacts/")
    assert not missing, missing


def test_the_install_page_gives_the_readmes_install_steps() -> None:
    # e2e/test_install_real.py runs the README's marked blocks; the install page repeats them
    # for readers of the site, so the two must not drift apart.
    step = re.compile(r"<!-- install-step: ([a-z-]+) -->\n```bash\n(.*?)\n```", re.S)
    readme = dict(step.findall(README))
    page = dict(step.findall(_page("tasks/install.md")))
    assert readme, "the README marks no install step"
    assert page == readme, "docs/tasks/install.md and README.md give different install steps"
