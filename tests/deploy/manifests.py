"""Helpers for the deployment-manifest tests: find kubectl, render kustomizations, check
objects against the Kubernetes types, and run kubectl against the API sandbox.

kubectl is required, never skipped: without it nothing proves the manifests render.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import models as k8s_models

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config"

KUBECTL_MISSING = (
    "kubectl is not installed, and these tests render and apply the manifests with it. "
    "Install it (Debian/Ubuntu: `apt-get update && apt-get install -y kubectl`, the package "
    "that provides /usr/bin/kubectl on Muster's machines; elsewhere see "
    "https://kubernetes.io/docs/tasks/tools/) and run the tests again. `hack/test` "
    "installs it."
)

Doc = dict[str, Any]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(KUBECTL_MISSING, pytrace=False)
    return path


def kustomizations(root: Path = CONFIG) -> list[Path]:
    """Every directory under ``root`` holding a kustomization file."""
    return sorted(p.parent for p in root.rglob("kustomization.yaml"))


def render(directory: Path, *extra: str) -> list[Doc]:
    proc = subprocess.run(
        [kubectl(), "kustomize", str(directory), *extra],
        capture_output=True, text=True, timeout=60, check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"kubectl kustomize {directory.relative_to(ROOT)} failed:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def find(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [
        d for d in docs
        if d.get("kind") == kind and (name is None or d["metadata"].get("name") == name)
    ]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = find(docs, kind, name)
    assert len(found) == 1, f"want one {kind} {name or ''}, found {len(found)}"
    return found[0]


# ---------------------------------------------------------------- schema (field names)

_MODEL_BY_KIND = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "PodTemplate"): "V1PodTemplate",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("batch/v1", "Job"): "V1Job",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("scheduling.k8s.io/v1", "PriorityClass"): "V1PriorityClass",
}


def builtin_model(doc: Doc) -> str | None:
    return _MODEL_BY_KIND.get((str(doc.get("apiVersion")), str(doc.get("kind"))))


def schema_errors(value: Any, type_name: str, path: str = "") -> list[str]:
    """Unknown field names and wrong JSON types against the Kubernetes OpenAPI types that
    kubernetes-asyncio was generated from (a real API server drops unknown fields or, with
    kubectl's strict validation, refuses them; a typo such as ``readOnlyRootFileSystem``
    would silently weaken the Deployment)."""
    if type_name.startswith("list["):
        if not isinstance(value, list):
            return [f"{path}: want a list, got {type(value).__name__}"]
        inner = type_name[5:-1]
        return [e for i, v in enumerate(value) for e in schema_errors(v, inner, f"{path}[{i}]")]
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            return [f"{path}: want a map, got {type(value).__name__}"]
        inner = type_name[5:-1].split(", ", 1)[1]
        return [e for k, v in value.items() for e in schema_errors(v, inner, f"{path}.{k}")]
    simple: dict[str, tuple[type, ...]] = {
        "str": (str,), "bool": (bool,), "int": (int,), "float": (int, float),
        "datetime": (str,), "date": (str,),
    }
    if type_name in simple:
        ok = isinstance(value, simple[type_name]) and not (
            type_name in ("int", "float") and isinstance(value, bool)
        )
        return [] if ok else [f"{path}: want {type_name}, got {value!r}"]
    if type_name == "object":
        return []
    model = getattr(k8s_models, type_name)
    if not isinstance(value, dict):
        return [f"{path}: want an object ({type_name}), got {type(value).__name__}"]
    by_json = {json_name: attr for attr, json_name in model.attribute_map.items()}
    errors: list[str] = []
    for key, item in value.items():
        attr = by_json.get(key)
        if attr is None:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
            continue
        errors.extend(schema_errors(item, model.openapi_types[attr], f"{path}.{key}"))
    return errors


# ---------------------------------------------------------------- kubectl against a server

async def kubectl_async(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    """Run kubectl without blocking the event loop the sandbox server runs in."""
    proc = await asyncio.create_subprocess_exec(
        kubectl(), "--kubeconfig", str(kubeconfig), *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(
        proc.communicate(stdin.encode() if stdin is not None else None), timeout=120
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"kubectl {' '.join(args)} exited {proc.returncode}:\n{err.decode()}\n{out.decode()}"
        )
    return out.decode()


def yaml_dump(docs: list[Doc]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)
