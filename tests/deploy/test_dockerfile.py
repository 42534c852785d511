"""The container image's Dockerfile, read (tests/deploy/test_image.py builds it with podman
and checks the result; these say why it is shaped so, and run in milliseconds).

What a cluster operator would notice if these broke: the image runs as root or with a name
the kubelet cannot verify as non-root, it writes outside /tmp under a read-only root
filesystem, it installs anything but the hash-checked lock, it ships pip or the dev tools,
its entrypoint is not ``muster run``, the build context lacks the files the wheel is built
from, or the Dockerfile only builds on our machines' local base.
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


def test_every_stage_builds_on_the_python_image_argument(dockerfile: Dockerfile) -> None:
    # Docker elsewhere: the public slim Python 3.11 image by default; our machines pass
    # PYTHON_IMAGE=<the Debian base hack/image/base.sh builds> (hack/build-image.sh).
    image, _, tag = (dockerfile.arg_default("PYTHON_IMAGE") or "").partition(":")
    assert image in ("python", "docker.io/library/python")
    assert tag.startswith("3.11-slim-bookworm"), "Debian bookworm, as the local base"
    names = [s.name for s in dockerfile.stages]
    assert names[:-1] == ["deps", "app"] and names[-1] is None
    bases = [s.base for s in dockerfile.stages]
    assert bases == ["${PYTHON_IMAGE}", "deps", "${PYTHON_IMAGE}"]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"


def test_dependencies_come_only_from_the_hashed_lock(dockerfile: Dockerfile) -> None:
    installs = [r.args for s in dockerfile.stages for r in s.all("RUN") if "pip" in r.args]
    locked = sorted(c.split("-r ")[1].strip() for a in installs for c in a.split("&&")
                    if "-r " in c)
    assert locked == ["/tmp/requirements.lock", "requirements-build.lock"]
    for args in installs:
        for command in args.split("&&"):
            if " install " not in command:
                continue
            # Every install is hash-checked from a lock, or Muster's own wheel with no index.
            assert ("--require-hashes" in command and "--only-binary=:all:" in command
                    and "--no-deps" in command) or (
                "--no-index" in command and "--no-deps" in command), command
    # The dependency layer is cached apart from the source: its only input is the lock file.
    deps = dockerfile.stages[0]
    assert [c.operands()[0] for c in deps.all("COPY")] == ["requirements.lock"]
    # Installers leave the runtime environment.
    assert "pip uninstall --quiet --yes pip setuptools" in " ".join(
        r.args for r in deps.all("RUN"))


def test_final_stage_is_the_base_plus_the_environment(dockerfile: Dockerfile) -> None:
    final = dockerfile.final
    assert not final.all("RUN"), "nothing runs in the final stage: no installers, no compilers"
    copies = [(c.flags().get("from"), c.operands()) for c in final.all("COPY")]
    assert copies == [("deps", ["/opt/muster", "/opt/muster"]),
                      ("app", ["/opt/app", "/opt/muster"])]
    assert not final.all("ADD")
    env = _env([i.args for i in final.all("ENV")])
    assert env["PATH"].startswith("/opt/muster/bin:")
    # The build-time CA (TLS-inspecting proxies) is an argument of the build stages only.
    assert not any(i.keyword == "ARG" and i.args.startswith("PIP_CERT")
                   for i in final.instructions)


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
    for key in ("HOME", "XDG_CACHE_HOME"):
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
    assert scripts.get("muster") == "controller.cli:cli"


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
    for ins in [c for s in dockerfile.stages[:-1] for c in s.all("COPY")]:
        assert "from" not in ins.flags()
        *sources, _dest = ins.operands()
        for src in sources:
            path = src.rstrip("/")
            assert (ROOT / path).exists(), f"line {ins.line}: {src} is not in the repository"
            assert not ignore.excluded(path), f"line {ins.line}: .dockerignore drops {src}"
            copied.add(path)
    needed = {"pyproject.toml", project["project"]["readme"], *packages, "requirements.lock",
              "requirements-build.lock", "crds", "e2e/kueue-crds"}
    assert needed <= copied, f"the builder does not copy {sorted(needed - copied)}"
    for pkg in packages:
        module = next((ROOT / pkg).rglob("*.py")).relative_to(ROOT).as_posix()
        assert not ignore.excluded(module), f".dockerignore drops {module}"
    # Tests, CRDs, caches and git metadata stay out of the context.
    for path in ("tests/test_quality.py", ".git/HEAD", "e2e/test_dra.py", "config/default",
                 "controller/__pycache__/x.pyc"):
        assert ignore.excluded(path), f"{path} should not be sent to the builder"
