"""The container image, checked by reading its Dockerfile (no Docker engine runs here).

What a cluster operator would notice if these broke: the image runs as root or with a name
the kubelet cannot verify as non-root, it writes outside /tmp under a read-only root
filesystem, it ships the dev tools, its entrypoint is not ``muster run``, or the build context
lacks the files the wheel is built from.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.deploy.dockerfile import Dockerfile, DockerIgnore, instructions, parse

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse(ROOT / "Dockerfile")


@pytest.fixture(scope="module")
def ignore() -> DockerIgnore:
    return DockerIgnore((ROOT / ".dockerignore").read_text())


def _env(stage_env: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in stage_env:
        for token in args.split():
            key, sep, value = token.partition("=")
            if sep:
                env[key] = value.strip('"')
    return env


def test_parser_reads_continuations_comments_and_exec_form() -> None:
    text = (
        "# c\nARG X=1\nFROM a AS b\nRUN one \\\n    # inner comment\n    two\n"
        'ENTRYPOINT ["x", "y"]\nCMD x y\n'
    )
    ins = instructions(text)
    assert [(i.keyword, i.args) for i in ins] == [
        ("ARG", "X=1"), ("FROM", "a AS b"), ("RUN", "one two"),
        ("ENTRYPOINT", '["x", "y"]'), ("CMD", "x y"),
    ]
    assert ins[3].exec_form == ["x", "y"]
    assert ins[4].exec_form is None
    with pytest.raises(ValueError, match="dangling backslash"):
        instructions("FROM a\nRUN x \\\n")


def test_dockerignore_rules_follow_docker_semantics() -> None:
    rules = DockerIgnore("*\n!src/\n**/__pycache__\n")
    assert rules.excluded("tests/test_x.py")
    assert not rules.excluded("src/a/b.py")
    assert rules.excluded("src/a/__pycache__/b.pyc")


def test_multi_stage_build_on_slim_python_311(dockerfile: Dockerfile) -> None:
    assert len(dockerfile.stages) >= 2, "a builder stage and a runtime stage"
    bases = [dockerfile.resolve(s.base) for s in dockerfile.stages]
    for base in bases:
        image, _, tag = base.partition(":")
        assert image in ("python", "docker.io/library/python"), base
        assert tag.startswith("3.11-slim"), f"{base}: want a slim Python 3.11 base"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"


def test_builder_builds_wheels_and_final_installs_only_them(dockerfile: Dockerfile) -> None:
    builder = dockerfile.stages[0]
    assert builder.name, "the builder stage needs a name for the final stage to refer to"
    assert any("pip wheel" in r.args for r in builder.all("RUN"))
    final_runs = dockerfile.final.all("RUN")
    installs = [r for r in final_runs if "pip install" in r.args]
    assert len(installs) == 1, "one pip install in the final stage"
    install = installs[0]
    # From the builder's wheels only: no index, no source tree, no [dev] extras.
    assert "--no-index" in install.args
    assert f"from={builder.name}" in install.flags().get("mount", "")
    assert "[dev]" not in install.args and "-e " not in install.args
    for ins in dockerfile.final.instructions:
        if ins.keyword in ("COPY", "ADD"):
            assert ins.flags().get("from") == builder.name, (
                f"line {ins.line}: the final stage copies only from the builder"
            )
        assert not (ins.keyword == "RUN" and "apt-get install" in ins.args), (
            f"line {ins.line}: no OS packages (compilers) in the final stage"
        )


def test_final_stage_runs_as_numeric_non_root_user(dockerfile: Dockerfile) -> None:
    users = dockerfile.final.all("USER")
    assert users, "the final stage must set USER"
    user = users[-1].args
    uid, _, gid = user.partition(":")
    # runAsNonRoot can only be verified by the kubelet for a numeric uid.
    assert uid.isdigit() and int(uid) != 0, f"USER {user}: numeric, non-zero uid"
    assert gid.isdigit() and int(gid) != 0, f"USER {user}: numeric, non-zero gid"
    last_user_line = users[-1].line
    assert all(
        i.line < last_user_line for i in dockerfile.final.instructions if i.keyword == "RUN"
    ), "nothing runs as root after USER is set"


def test_runtime_writes_only_under_tmp(dockerfile: Dockerfile) -> None:
    env = _env([i.args for i in dockerfile.final.all("ENV")])
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
    for key in ("HOME", "MPLCONFIGDIR", "XDG_CACHE_HOME"):
        assert env.get(key, "").startswith("/tmp"), f"{key} must point into /tmp"
    workdirs = dockerfile.final.all("WORKDIR")
    assert workdirs and workdirs[-1].args == "/tmp"
    assert not dockerfile.final.all("VOLUME"), "volumes come from the Deployment (emptyDir)"


def test_entrypoint_is_muster_run_in_exec_form(dockerfile: Dockerfile) -> None:
    entry = dockerfile.final.all("ENTRYPOINT")
    assert entry, "ENTRYPOINT missing"
    # Exec form: PID 1 is Python itself, so SIGTERM reaches muster's signal handler.
    assert entry[-1].exec_form == ["muster", "run"]
    cmd = dockerfile.final.all("CMD")
    assert cmd and cmd[-1].exec_form == ["--in-cluster"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get("muster") == "controller.cli:app"


def test_oci_labels(dockerfile: Dockerfile) -> None:
    labels = " ".join(i.args for i in dockerfile.final.all("LABEL"))
    for key in ("title", "description", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    license_ = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert f'org.opencontainers.image.licenses="{license_["text"]}"' in labels


def test_build_context_holds_what_the_wheel_needs(
    dockerfile: Dockerfile, ignore: DockerIgnore
) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    copied: set[str] = set()
    for ins in dockerfile.stages[0].all("COPY"):
        assert "from" not in ins.flags()
        *sources, _dest = ins.operands()
        for src in sources:
            path = src.rstrip("/")
            assert (ROOT / path).exists(), f"line {ins.line}: {src} is not in the repository"
            assert not ignore.excluded(path), f"line {ins.line}: .dockerignore drops {src}"
            copied.add(path)
    needed = {"pyproject.toml", project["project"]["readme"], *packages}
    assert needed <= copied, f"the builder does not copy {sorted(needed - copied)}"
    for pkg in packages:
        module = next((ROOT / pkg).rglob("*.py")).relative_to(ROOT).as_posix()
        assert not ignore.excluded(module), f".dockerignore drops {module}"
    # Tests, CRDs, caches and git metadata stay out of the context.
    for path in ("tests/test_quality.py", ".git/HEAD", "crds", "controller/__pycache__/x.pyc"):
        assert ignore.excluded(path), f"{path} should not be sent to the builder"
