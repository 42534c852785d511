"""The crash harness (:mod:`e2e.chaos`) on the real control plane, a short seeded subset for
CI: ``muster run`` killed at every named step of the acquisition path in turn, a leader
killed with SIGKILL mid-acquisition while a standby waits, kube-apiserver restarted with
Muster running; then every invariant checked against the API. The ≥1,000-crash run is
``python3 -m e2e.chaos --crashes 1000 ...`` (docs/testing/chaos.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from controller.common import crashpoints
from e2e import cluster as cp
from e2e.chaos import Chaos, Options
from e2e.real import MusterProcess

pytestmark = pytest.mark.real


@pytest.fixture
def muster_set_aside(real_cluster: cp.Cluster, real_muster: MusterProcess) -> Iterator[cp.Cluster]:
    """The session's Muster stopped while the harness runs its own (two would serve the same
    requests); started again afterwards."""
    real_muster.stop()
    try:
        yield real_cluster
    finally:
        real_muster.start()


def test_crashes_at_every_step_a_failover_and_an_apiserver_restart_keep_every_promise(
    muster_set_aside: cp.Cluster,
) -> None:
    opts = Options(seed=17, crashes=len(crashpoints.STEPS) + 2, max_minutes=5,
                   failover_every=5, apiserver_every=7, settle=20, cycle_steps=True)
    result = asyncio.run(Chaos(muster_set_aside, opts).main())
    assert not result.violations, "\n".join(result.violations)
    assert result.crashes == len(crashpoints.STEPS) + 2
    assert result.failovers == 1 and result.apiserver_restarts == 1
    reached = {k.removeprefix("at ") for k in result.planned if not k.endswith("killed")}
    assert len(reached & set(crashpoints.STEPS)) >= 4, result.planned
    assert any(k.startswith(("Provisioned/", "BookingExpired/")) for k in result.outcomes), \
        result.outcomes
