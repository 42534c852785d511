"""What Muster could provision and why a gang waits, as a user sees it, on both tiers.

The CapacityPool status the controller writes, the reason a waiting request carries, and
``kubectl muster`` (run as its own process, read-only, with an admin kubeconfig) must agree
with what the controller then does: the plugin says "fits in rack X with N new nodes" and
the controller provisions exactly N nodes in rack X; the plugin says "short by 1 pod in rack
Y" and the request's condition says the same.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from controller.commands import objects
from controller.kube import Body
from controller.kube.resources import CAPACITY_POOLS, POD_TEMPLATES, PODS
from e2e.conftest import Env, eventually

ATOMIC = "atomic-provisioning.muster.dev"
CHECK = "check-capacity.muster.dev"
ROOT = Path(__file__).resolve().parents[1]


async def kubectl_muster(env: Env, *args: str) -> tuple[int, str, str]:
    """``kubectl muster ARGS --kubeconfig ...`` in its own process: (exit code, out, err)."""
    assert env.kubeconfig is not None
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controller.commands.kubectl_plugin", *args,
        "--kubeconfig", str(env.kubeconfig), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def pool_status(env: Env, pool: str) -> dict[str, Any]:
    body = await env.kube.get(CAPACITY_POOLS, pool)
    return dict(body.get("status") or {})


def domain(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(d for d in status.get("domains") or [] if d["name"] == name)


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def request_file(env: Env, tmp: Path, name: str, template: Body, count: int,
                 class_name: str = ATOMIC) -> Path:
    path = tmp / f"{name}.yaml"
    request = objects.provisioning_request(name, pod_sets=[(template["metadata"]["name"],
                                                            count)],
                                           namespace=env.namespace, class_name=class_name)
    path.write_text(yaml.safe_dump_all([request, template]))
    return path


async def test_pool_status_and_the_plugin_agree_with_what_the_controller_provisions(
    env: Env, tmp_path: Path
) -> None:
    pool = await env.gpu_pool(blocks=1, racks_per_block=2, nodes_per_rack=4, max_nodes=8)
    template = objects.pod_template(
        "workers", namespace=env.namespace, requests={"cpu": "90", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
        node_selector=env.selector,
    )

    async def status_of_an_empty_pool() -> dict[str, Any] | None:
        status = await pool_status(env, pool)
        # ProviderReady turns True at the provider's first answer (the collector lists
        # every pool each interval).
        ok = condition(status, "Valid").get("status") == "True" and condition(
            status, "ProviderReady").get("status") == "True"
        return status if ok else None

    status = await eventually(status_of_an_empty_pool, within=60,
                              what="the pool's first status")
    assert status["provisionableNodes"] == 8 and status["nodes"] == 0
    assert [(d["name"], d["provisionableNodes"], d["maxNodes"]) for d in status["domains"]] \
        == [("b1/b1-r1", 4, 4), ("b1/b1-r2", 4, 4)]
    assert domain(status, "b1/b1-r1")["provisionable"][objects.GPU] == "32"
    assert condition(status, "ProviderReady")["status"] == "True"
    assert condition(status, "StockOut")["status"] == "False"

    # What-if: read-only, nothing is created.
    code, out, err = await kubectl_muster(
        env, "fit", "-f", str(request_file(env, tmp_path, "train", template, 3)),
        "-n", env.namespace, "-o", "json")
    assert code == 0, err
    said = json.loads(out)
    assert said["fits"] is True and said["newNodeCount"] == 3
    (bought,) = said["newNodes"]
    assert bought["pool"] == pool and bought["count"] == 3
    rack = bought["domain"][objects.RACK]
    assert not await env.kube.get_or_none(POD_TEMPLATES, "workers", namespace=env.namespace)
    assert not await env.pool_nodes(pool)

    # The controller then does exactly that.
    await env.kube.create(POD_TEMPLATES, template, namespace=env.namespace)
    await env.request("train", [("workers", 3)], class_name=ATOMIC)
    cond = await env.wait_condition("train", "Provisioned", within=60)
    assert cond["reason"] == "CapacityIsProvisioned"
    nodes = await env.pool_nodes(pool)
    assert len(nodes) == 3
    assert {n["metadata"]["labels"][objects.RACK] for n in nodes} == {rack}
    # The gang's pods take the nodes (the e2e booking lasts 4 s: unused nodes would go).
    await env.pods_for("train", template, 3)
    await eventually(lambda: _bound(env, 3), within=60, what="the gang's pods bound")

    # The pool's status follows: three Ready nodes in that rack, all GPUs taken, one more
    # node can be added there.
    async def status_after() -> dict[str, Any] | None:
        status = await pool_status(env, pool)
        row = domain(status, f"b1/{rack}") if status.get("domains") else {}
        done = row.get("nodes") == 3 and row.get("readyNodes") == 3 and \
            row.get("free", {}).get(objects.GPU) == "0"
        return status if done else None

    status = await eventually(status_after, within=60, what="the status after provisioning")
    row = domain(status, f"b1/{rack}")
    assert row["provisionableNodes"] == 1 and row["inFlightNodes"] == 0
    assert row["freeNodes"] == 0 and row["availableNodes"] == 1
    assert status["nodes"] == 3 and status["provisionableNodes"] == 5
    assert status["freeGPUs"] == 0

    # kubectl muster capacity shows the same rows; explain shows the booked plan.
    code, out, err = await kubectl_muster(env, "capacity", "-o", "json")
    assert code == 0, err
    rows = {r["domain"]: r for r in json.loads(out)["domains"] if r["pool"] == pool}
    assert rows.keys() == {d["name"] for d in status["domains"]}
    assert (rows[f"b1/{rack}"]["nodes"], rows[f"b1/{rack}"]["provisionableNodes"]) == (3, 1)
    code, out, err = await kubectl_muster(env, "capacity")
    assert code == 0, err
    assert pool in out and "PROVISIONABLE" in out
    code, out, err = await kubectl_muster(env, "explain", "train", "-n", env.namespace,
                                          "-o", "json")
    assert code == 0, err
    explained = json.loads(out)
    assert explained["conditions"]["Provisioned"]["status"] == "True"
    booking = explained["booking"]
    assert booking["newNodes"][0]["domain"][objects.RACK] == rack
    assert sorted(booking["acquiredNodes"]) == sorted(n["metadata"]["name"] for n in nodes)


async def _bound(env: Env, count: int) -> bool:
    return await env.bound_pods() >= count


async def test_a_waiting_request_says_its_shortfall_as_the_plugin_does(
    env: Env, tmp_path: Path
) -> None:
    await env.existing_gpu_nodes(4, rack="b1-r1")
    template = await env.worker_template()
    await env.request("first", [("workers", 1)], class_name=CHECK)
    assert (await env.wait_condition("first", "Provisioned", within=60))["reason"] == \
        "CapacityIsFound"
    # Its pod runs: one of the four nodes is taken for good (not only for the booking).
    await env.pods_for("first", template, 1)
    await eventually(lambda: _bound(env, 1), within=60, what="the first pod bound")

    # Before the second request exists: the plugin says it does not fit, by how much, where.
    code, out, err = await kubectl_muster(
        env, "fit", "-f", str(request_file(env, tmp_path, "second", template, 4, CHECK)),
        "-n", env.namespace, "-o", "json")
    assert code == 1, err
    said = json.loads(out)
    assert said["fits"] is False and said["permanent"] is False
    assert "short by 1 pod(s)" in said["shortfall"]
    assert "the closest rack, b1/b1-r1, can hold 3 of 4" in said["shortfall"]
    assert "More capacity can appear" in said["shortfall"]

    # The controller, planning the same request, writes the same shortfall on it.
    await env.request("second", [("workers", 4)], class_name=CHECK)

    async def waiting() -> dict[str, Any] | None:
        cond = await env.condition("second", "Provisioned")
        if cond and cond["status"] == "False" and cond["reason"] in (
                "CapacityIsNotFound", "RetriesExhausted"):
            return cond
        return None

    cond = await eventually(waiting, within=60, what="the second request's shortfall")
    assert said["shortfall"] in cond["message"], cond["message"]

    # Explain reads it back, and planning it again now still says the same.
    code, out, err = await kubectl_muster(env, "explain", "second", "-n", env.namespace,
                                          "-o", "json")
    assert code == 0, err
    explained = json.loads(out)
    assert said["shortfall"] in explained["conditions"]["Provisioned"]["message"]
    if explained["conditions"].get("Failed", {}).get("status") != "True":
        assert explained["now"]["shortfall"] == said["shortfall"]

    # No kubelet runs these nodes on the real tier: the pod goes at once, or its namespace
    # would wait for the pod garbage collector once the node is deleted.
    await env.kube._request("DELETE", PODS.path(namespace=env.namespace, name="first-0"),
                            query={"gracePeriodSeconds": 0})
    await eventually(lambda: _no_pods(env), within=60, what="the first pod to be gone")


async def _no_pods(env: Env) -> bool:
    listing = await env.kube.list(PODS, namespace=env.namespace)
    return not listing.get("items")


async def test_an_invalid_pool_says_why_and_the_plugin_errors_are_one_line(
    env: Env, tmp_path: Path
) -> None:
    # A value the admission policy lets through (the parameter is known) but the provider
    # refuses: only Muster can tell, on the pool's status.
    body = objects.gpu_pool(env.name("bad"), parameters={"defaultStock": -3})
    body["spec"]["nodeTemplate"]["labels"].update(env.selector)
    await env.kube.create(CAPACITY_POOLS, body)
    env.cleanup.append(lambda: env.kube.delete(CAPACITY_POOLS, body["metadata"]["name"]))

    async def invalid() -> dict[str, Any] | None:
        status = await pool_status(env, body["metadata"]["name"])
        return status if condition(status, "Valid").get("status") == "False" else None

    status = await eventually(invalid, within=30, what="Valid=False on the pool")
    message = condition(status, "Valid")["message"]
    assert "spec.parameters" in message and "defaultStock" in message, message
    assert status["provisionableNodes"] == 0

    # Neither the plugin nor the controller plans on it (every acquisition would fail); both
    # say the gang waits for the pool's fix, naming it, rather than that it never fits.
    template = objects.pod_template(
        "workers", namespace=env.namespace, requests={"cpu": "90", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
        node_selector=env.selector,
    )
    code, out, err = await kubectl_muster(
        env, "fit", "-f", str(request_file(env, tmp_path, "gang", template, 2)),
        "-n", env.namespace, "-o", "json")
    assert code == 1, err
    said = json.loads(out)
    assert said["fits"] is False and said["permanent"] is False, said
    (problem,) = said["unusablePools"][body["metadata"]["name"]]
    assert "defaultStock" in problem, said
    await env.kube.create(POD_TEMPLATES, template, namespace=env.namespace)
    await env.request("gang", [("workers", 2)], class_name=ATOMIC)
    # The controller's request waits for the pool's fix, naming it, within its retry budget
    # (the e2e config's 3 attempts: RetriesExhausted within a second).
    failed = await env.wait_condition("gang", "Failed", within=60)
    assert failed["reason"] == "RetriesExhausted", failed
    assert f"CapacityPool {body['metadata']['name']} (spec.parameters:" in failed["message"]
    assert "defaultStock" in failed["message"], failed["message"]
    assert not await env.pool_nodes(body["metadata"]["name"])
    code, out, err = await kubectl_muster(env, "capacity")
    assert code == 0, err
    assert body["metadata"]["name"] in out and "defaultStock" in out

    code, out, err = await kubectl_muster(env, "explain", "nothing-here", "-n", env.namespace)
    assert code == 2
    assert err.strip() == f"error: provisioningrequest {env.namespace}/nothing-here not found"
    missing = tmp_path / "absent.yaml"
    code, out, err = await kubectl_muster(env, "fit", "-f", str(missing))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "absent.yaml" in err
