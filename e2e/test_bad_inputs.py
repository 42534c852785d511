"""The bad-input corpus (``tests/corpus/bad_inputs.yaml``) against Muster, on both tiers.

One test per kind and tier creates every case of the kind at once, then a valid control
request beside them, and checks: each case gets exactly its declared outcome (a rejection at
admission naming the problem, a Failed condition with its reason, or no condition at all for
what is not Muster's); the control request provisions; no node was bought for any case (every
node of the run belongs to the control request); Muster stays healthy (no task died, the
process runs and answers ``/healthz``) and logged no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.commands import objects
from controller.common.topology_defaults import KEY_LABEL
from controller.kube import ApiError, Body
from controller.kube.resources import (
    CAPACITY_POOLS,
    NODES,
    POD_TEMPLATES,
    PROVISIONING_REQUESTS,
    Resource,
)
from controller.kueue.resources import WORKLOADS
from controller.state.tenancy import owner_uid_of_key
from e2e.conftest import RUN_LABEL, TIERS, Env, eventually

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus" / "bad_inputs.yaml"
POD_GROUPS = Resource("scheduling.k8s.io", "v1beta1", "podgroups", namespaced=True,
                      kind="PodGroup")
ATOMIC = "atomic-provisioning.muster.dev"
CASE_LABEL = "corpus.muster.dev/case"
OBJECT_KINDS = ("ProvisioningRequest", "PodTemplate", "CapacityPool", "PodGroup", "Workload")
"""The corpus's kinds of objects; ConfigFile and CLI cases run as command lines."""


def corpus() -> dict[str, list[dict[str, Any]]]:
    data: dict[str, list[dict[str, Any]]] = yaml.safe_load(CORPUS.read_text())
    return data


def expected(case: dict[str, Any], tier: str) -> dict[str, Any]:
    found = case.get(tier) or case.get("expect")
    assert found, f"case {case['id']} declares no outcome for the {tier} tier"
    return dict(found)


def merge(base: Any, change: Any) -> Any:
    """``change`` deep-merged into a copy of ``base``: mappings merge, a None deletes the
    key, anything else (lists included) replaces."""
    if not isinstance(base, dict) or not isinstance(change, dict):
        return copy.deepcopy(change)
    out = copy.deepcopy(base)
    for key, value in change.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


class Tracebacks(logging.Handler):
    """Log records of the in-process controller that carry a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or "Traceback" in record.getMessage():
            self.seen.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def watch_tracebacks(request: pytest.FixtureRequest, env: Env) -> Iterator[list[str]]:
    """Tracebacks Muster logged meanwhile: its own process's log file on the real tier, the
    in-process loggers in the sandbox."""
    found: list[str] = []
    if env.external:
        muster = request.getfixturevalue("real_muster")
        start = muster.log.stat().st_size if muster.log.exists() else 0
        yield found
        with muster.log.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        found += [line for line in text.splitlines() if "Traceback" in line]
        return
    handler = Tracebacks()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield found
    finally:
        root.removeHandler(handler)
        found += handler.seen


# --------------------------------------------------------------------------- objects


def _request(env: Env, name: str, template: str, count: int = 1) -> Body:
    return objects.provisioning_request(name, pod_sets=[(template, count)],
                                        namespace=env.namespace, class_name=ATOMIC)


def _worker(env: Env, name: str, selector: dict[str, str] | None = None) -> Body:
    return objects.pod_template(
        name, namespace=env.namespace, requests={"cpu": "90", "memory": "900Gi",
                                                 objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
        node_selector={**env.selector, **(selector or {})})


def _pod_group(env: Env, name: str) -> Body:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": env.namespace},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}


def _workload(env: Env, name: str) -> Body:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": env.namespace},
            "spec": {"queueName": "corpus", "podSets": [{
                "name": "main", "count": 1,
                "template": {"spec": {"containers": [{"name": "c", "image": "pause"}]}}}]}}


async def _create(env: Env, case: dict[str, Any], kind: str) -> tuple[str, ApiError | None]:
    """Create the case's objects; (the request to watch, or "", the refusal if refused)."""
    cid = case["id"]
    try:
        if kind == "ProvisioningRequest":
            body = _request(env, cid, "workers")
            body["spec"] = merge(body["spec"], case.get("spec") or {})
            body["metadata"] = merge(body["metadata"], case.get("metadata") or {})
            await env.kube.create(PROVISIONING_REQUESTS, body, namespace=env.namespace)
            return cid, None
        if kind == "PodTemplate":
            tpl = _worker(env, cid)
            tpl["template"] = merge(tpl["template"], case.get("template") or {})
            tpl["template"]["metadata"]["annotations"] = merge(
                tpl["template"]["metadata"].get("annotations") or {},
                case.get("annotations") or {})
            await env.kube.create(POD_TEMPLATES, tpl, namespace=env.namespace)
            await env.kube.create(PROVISIONING_REQUESTS,
                                  _request(env, cid, cid, case.get("count", 1)),
                                  namespace=env.namespace)
            return cid, None
        if kind == "CapacityPool":
            pool = objects.gpu_pool(env.name(cid))
            pool["spec"]["nodeTemplate"]["labels"].update({**env.selector, CASE_LABEL: cid})
            pool["spec"] = merge(pool["spec"], case.get("spec") or {})
            await env.kube.create(CAPACITY_POOLS, pool)
            env.cleanup.append(lambda n=pool["metadata"]["name"]: env.kube.delete(
                CAPACITY_POOLS, n))

            # The request comes once Muster judged the pool (its status written): a pool
            # the provider refuses is left out of planning from then on (its request waits
            # for the fix, PoolUnusable), and a request planned before that moment met the
            # provider's refusal instead (the outcome depended on which came first).
            async def judged(name: str = pool["metadata"]["name"]) -> bool:
                got = await env.kube.get(CAPACITY_POOLS, name)
                return bool((got.get("status") or {}).get("conditions"))

            await eventually(judged, within=30, what=f"Muster to judge pool {cid}")
            await env.kube.create(POD_TEMPLATES, _worker(env, cid, {CASE_LABEL: cid}),
                                  namespace=env.namespace)
            await env.kube.create(PROVISIONING_REQUESTS, _request(env, cid, cid),
                                  namespace=env.namespace)
            return cid, None
        res, build = {"PodGroup": (POD_GROUPS, _pod_group),
                      "Workload": (WORKLOADS, _workload)}[kind]
        body = build(env, cid)
        body["spec"] = merge(body["spec"], case.get("spec") or {})
        await env.kube.create(res, body, namespace=env.namespace)
        return "", None
    except ApiError as exc:
        return "", exc


async def _outcome(env: Env, name: str) -> dict[str, Any] | None:
    pr = await env.kube.get_or_none(PROVISIONING_REQUESTS, name, namespace=env.namespace)
    for cond in ((pr or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Failed", "Provisioned") and cond.get("status") == "True":
            return dict(cond)
    return None


def _check_refusal(cid: str, want: dict[str, Any], refused: ApiError | None) -> list[str]:
    kind = want["admission"]
    if refused is None:
        return [f"{cid}: created, expected a refusal ({kind})"]
    if kind == "not-served":
        return [] if refused.status == 404 else [
            f"{cid}: expected 404 (not served), got {refused.status}: {refused.body[:200]}"]
    problems = []
    if refused.status not in (400, 422):
        problems.append(f"{cid}: expected 400/422 ({kind}), got {refused.status}")
    body = str(refused.body)
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        body = str(json.loads(body).get("message") or body)  # the Status's message, unescaped
    if want.get("words") and want["words"] not in body:
        problems.append(f"{cid}: refusal lacks {want['words']!r}: {body[:300]}")
    if kind == "vap" and "ValidatingAdmissionPolicy" not in body:
        problems.append(f"{cid}: not refused by an admission policy: {body[:300]}")
    if kind == "kueue-webhook" and "admission webhook" not in body:
        problems.append(f"{cid}: not refused by Kueue's webhook: {body[:300]}")
    if kind in ("crd-schema", "builtin") and "admission" in body.lower():
        problems.append(f"{cid}: refused by admission, not by {kind}: {body[:300]}")
    return problems


@pytest.mark.parametrize("kind", OBJECT_KINDS)
async def test_bad_inputs(env: Env, kind: str, request: pytest.FixtureRequest) -> None:
    tier = "real" if env.external else "sandbox"
    cases = corpus()[kind]
    await env.gpu_pool()
    await env.kube.create(POD_TEMPLATES, _worker(env, "workers"), namespace=env.namespace)
    bought: dict[str, str] = {}  # every node of the run seen meanwhile -> its key

    async def sample_once() -> None:
        nodes = await env.kube.list(NODES, label_selector=f"{RUN_LABEL}={env.run}")
        for node in nodes.get("items") or []:
            bought[node["metadata"]["name"]] = node["metadata"]["labels"].get(KEY_LABEL, "")

    async def sample() -> None:
        while True:
            await sample_once()
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    with watch_tracebacks(request, env) as tracebacks:
        created = [await _create(env, case, kind) for case in cases]
        await env.kube.create(PROVISIONING_REQUESTS, _request(env, "control", "workers", 2),
                              namespace=env.namespace)
        problems: list[str] = []
        watched: dict[str, dict[str, Any]] = {}
        for case, (name, refused) in zip(cases, created, strict=True):
            want = expected(case, tier)
            if "admission" in want:
                problems += _check_refusal(case["id"], want, refused)
            elif refused is not None:
                problems.append(f"{case['id']}: refused ({refused.status}: "
                                f"{refused.body[:300]}), expected {want}")
            else:
                watched[name] = want

        control = await env.wait_condition("control", "Provisioned", within=60)
        assert control["reason"] == "CapacityIsProvisioned", control
        outcomes: dict[str, dict[str, Any] | None] = {}
        for _ in range(600):  # up to about a minute
            outcomes = {n: await _outcome(env, n) for n in watched}
            if all(outcomes[n] is not None for n, w in watched.items() if "condition" in w):
                break
            await asyncio.sleep(0.1)
        for name, want in watched.items():
            got = outcomes[name]
            if want.get("untouched"):
                pr = await env.get(name)
                if (pr.get("status") or {}).get("conditions"):
                    problems.append(f"{name}: expected no condition, got "
                                    f"{pr['status']['conditions']}")
                continue
            if got is None:
                problems.append(f"{name}: no outcome within a minute, expected {want}")
                continue
            if got["type"] != want["condition"] or got["reason"] != want["reason"]:
                problems.append(f"{name}: expected {want['condition']}/{want['reason']}, got "
                                f"{got['type']}/{got['reason']}: {got['message'][:300]}")
            elif want.get("words") and want["words"] not in got["message"]:
                problems.append(f"{name}: message lacks {want['words']!r}: {got['message']}")
        # No node bought for any case: every node of the run seen is the control request's.
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await sample_once()  # the control's nodes may have come and gone between samples
        control_uid = (await env.get("control"))["metadata"]["uid"]
        for node, key in sorted(bought.items()):
            if owner_uid_of_key(key) != control_uid:
                problems.append(f"node {node} was bought for a case (key {key})")
        if not any(owner_uid_of_key(k) == control_uid for k in bought.values()):
            problems.append("the sampler never saw the control request's nodes")
        await asyncio.sleep(0.5)  # a crash caused by the last case has time to show
        if env.unhealthy is not None:
            problems += [f"Muster unhealthy: {p}" for p in await env.unhealthy()]
    problems += [f"traceback logged: {t}" for t in tracebacks]
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- config, CLI

MISSPELT = """\
apiVersion: autoscaling.x-k8s.io/v1
kind: ProvisioningRequest
metadata: {name: r, namespace: default}
spec:
  provisioningClassName: atomic-provisioning.muster.dev
  podSets: [{podTemplateRef: {name: t}, count: 1}]
---
apiVersion: v1
kind: PodTemplate
metadata: {name: t, namespace: default}
template:
  spec:
    nodeSelektor: {a: b}
    containers: [{name: c, image: pause}]
"""


async def _run_cli(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controller.cli", *args, cwd=ROOT, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, "", "timed out after 60 s (it did not stop at the bad input)"
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


@contextlib.asynccontextmanager
async def _tier_kubeconfig(tier: str, request: pytest.FixtureRequest,
                           tmp: Path) -> AsyncIterator[Path]:
    if tier == "real":
        yield request.getfixturevalue("real_cluster").muster_kubeconfig
        return
    from sandbox.server import SandboxServer

    async with SandboxServer() as server:
        yield server.write_kubeconfig(tmp / "kubeconfig")


@pytest.mark.parametrize("tier", TIERS)
async def test_bad_config_files_and_command_lines(
    tier: str, request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    data = corpus()
    cases = [("ConfigFile", c) for c in data["ConfigFile"]] + [("CLI", c) for c in data["CLI"]]
    (tmp_path / "ok.yaml").write_text("leader_election: {enabled: false}\n")
    (tmp_path / "bad.yaml").write_text("not: [yaml\n")
    (tmp_path / "misspelt.yaml").write_text(MISSPELT)
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith("MUSTER_") and k not in ("KUBERNETES_SERVICE_HOST",
                                                             "KUBERNETES_SERVICE_PORT")}
    problems: list[str] = []
    async with _tier_kubeconfig(tier, request, tmp_path) as kubeconfig:
        slots = {"kubeconfig": str(kubeconfig), "ok": str(tmp_path / "ok.yaml"),
                 "bad_yaml": str(tmp_path / "bad.yaml"),
                 "misspelt": str(tmp_path / "misspelt.yaml")}
        gate = asyncio.Semaphore(4)

        async def one(kind: str, case: dict[str, Any]) -> list[str]:
            config = tmp_path / f"{case['id']}.yaml"
            if "config" in case:
                config.write_text(case["config"])
            args = case.get("args") or ["run", "--config", str(config), "--kubeconfig",
                                        "{kubeconfig}"]
            args = [a.format(**slots) for a in args]
            async with gate:
                code, out, err = await _run_cli(args, {**base_env, **case.get("env", {})})
            lines = [line for line in err.splitlines() if line.strip()]
            where = f"{kind} {case['id']} (muster {' '.join(args)})"
            found = []
            if code != case.get("exit", 2):
                found.append(f"{where}: exit {code}, expected {case.get('exit', 2)}: "
                             f"{err[-500:]}")
            if len(lines) != 1:
                found.append(f"{where}: {len(lines)} lines on stderr, expected one: "
                             f"{err[-800:]}")
            if case["words"] not in err:
                found.append(f"{where}: stderr lacks {case['words']!r}: {err[-500:]}")
            if "Traceback" in err or "Traceback" in out:
                found.append(f"{where}: a traceback")
            return found

        for found in await asyncio.gather(*(one(kind, case) for kind, case in cases)):
            problems += found
    assert not problems, "\n".join(problems)
