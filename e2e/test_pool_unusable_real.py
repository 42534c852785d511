"""A pool the provider refuses, fixed while a request waits for it, on the real control plane.

The only CapacityPool that could hold a gang has a parameter the fake provider refuses
(``defaultStock: -1``). Muster leaves the pool out of planning and its status says why; the
request waits for the fix (``Provisioned=False``, ``PoolUnusable``, naming the pool and the
parameter) instead of failing ``CapacityNeverFits`` for good. Once the pool is patched, the
same request is provisioned: no need to recreate it.

The session's Muster (e2e/muster-e2e.yaml) gives a request 3 attempts, about a second; this
scenario runs its own ``muster run`` with ``retry.max_attempts`` 300 (the 1 s backoff cap:
five minutes), as a production config's 720 attempts at 60 s leave hours to fix a pool.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.kube import KubeClient
from controller.kube.resources import CAPACITY_POOLS
from e2e.conftest import Env, _cleanup, _namespace, e2e_config, eventually
from e2e.real import MusterProcess, forbidden

pytestmark = pytest.mark.real


@pytest.fixture
def patient_muster(real_muster: MusterProcess) -> Iterator[MusterProcess]:
    """``muster run`` with a long retry budget, in place of the session's (one leader)."""
    real_muster.stop()
    mine = MusterProcess(real_muster.cluster,
                         extra_env={"MUSTER_RETRY__MAX_ATTEMPTS": "300"})
    mine.new_lines()
    try:
        mine.start()
        yield mine
    finally:
        code = mine.stop()
        lines = mine.new_lines()
        real_muster.start()
    assert code == 0, f"muster run exited {code} on SIGTERM"
    assert not forbidden(lines), forbidden(lines)[:5]
    assert not [line for line in lines if "Traceback" in line], "a traceback was logged"


@pytest.fixture
async def env(patient_muster: MusterProcess) -> AsyncIterator[Env]:
    run = uuid.uuid4().hex[:8]
    kubeconfig = Path(patient_muster.cluster.admin_kubeconfig)
    async with await KubeClient.from_kubeconfig(kubeconfig) as kube:
        e = Env(kube=kube, namespace=f"e2e-{run}", run=run, external=True,
                config=e2e_config(), kubeconfig=kubeconfig)
        await _namespace(kube, e.namespace)
        try:
            yield e
        finally:
            await _cleanup(e)


async def _pool_condition(env: Env, pool: str, type_: str) -> dict[str, Any] | None:
    got = await env.kube.get(CAPACITY_POOLS, pool)
    return next((c for c in (got.get("status") or {}).get("conditions") or []
                 if c.get("type") == type_), None)


async def test_a_request_waits_for_its_refused_pool_and_provisions_once_it_is_fixed(
    env: Env,
) -> None:
    pool = await env.gpu_pool(parameters={"defaultStock": -1})

    async def refused() -> dict[str, Any] | None:
        cond = await _pool_condition(env, pool, "Valid")
        return cond if cond is not None and cond["status"] == "False" else None

    valid = await eventually(refused, within=30, what="Muster to judge the pool")
    assert "defaultStock" in valid["message"], valid
    await env.worker_template()
    await env.request("train", [("workers", 2)])

    async def waiting() -> dict[str, Any] | None:
        cond = await env.condition("train", "Provisioned")
        return cond if cond is not None and cond["reason"] == "PoolUnusable" else None

    cond = await eventually(waiting, within=30, what="the request to wait for its pool")
    assert cond["status"] == "False", cond
    assert f"CapacityPool {pool} (spec.parameters: " in cond["message"], cond["message"]
    assert "defaultStock must be" in cond["message"], cond["message"]
    # More attempts than the session's config allows in all: still waiting, not failed.
    await eventually(lambda: _attempt_over(env, "train", 4), within=30,
                     what="the request to be retried")
    assert await env.condition("train", "Failed") is None

    await env.kube.merge_patch(CAPACITY_POOLS, pool,
                               {"spec": {"parameters": {"defaultStock": None}}})
    done = await env.wait_condition("train", "Provisioned", within=60)
    assert done["reason"] == "CapacityIsProvisioned", done
    assert await env.condition("train", "Failed") is None
    valid_now = await _pool_condition(env, pool, "Valid")
    assert valid_now is not None and valid_now["status"] == "True", valid_now


async def _attempt_over(env: Env, request: str, attempts: int) -> bool:
    pr = await env.get(request)
    return int((pr["metadata"].get("annotations") or {}).get("muster.dev/attempt", 0)) > attempts
