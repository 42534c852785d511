"""The real kube-scheduler as the oracle (issue 13): a small seeded subset of the differential
test in CI. Two cases per field of e2e/parity_cases.py (case ``i`` focuses on
``FIELDS[i % len(FIELDS)]``), each judged by Muster (``muster fit --mode check``) and by the
real scheduler binding the gang's pods on kwok nodes; every judged case must agree (a
disagreement under a documented limit, e2e.scheduler_oracle.KNOWN_LIMITS, is reported, not
failed). The full run is ``python3 -m e2e.scheduler_oracle --seed 0 --count 500``
(docs/testing/scheduler-oracle.md)."""

from __future__ import annotations

import pytest

from e2e import cluster as cp
from e2e.parity_cases import FIELDS, cases
from e2e.scheduler_oracle import AGREE, failed, oracle, report, tally

pytestmark = pytest.mark.real

SEED = 0
COUNT = 2 * len(FIELDS)


@pytest.mark.timeout(240)
async def test_the_real_scheduler_agrees_with_muster(real_cluster: cp.Cluster) -> None:
    outcomes = await oracle(cases(SEED, COUNT), real_cluster.admin_kubeconfig,
                            concurrency=8)
    lines = "\n".join(report(outcomes))
    counts = tally(outcomes)
    # Every judged case agrees, but for the documented limits (Muster's "fits" for pod sets
    # whose placement the scheduler's scores decide; none in this subset today).
    assert not failed(outcomes), lines
    # Enough judged cases that the subset means something (the rest are refused or
    # node-name cases, which the cluster cannot judge).
    assert counts[AGREE] >= COUNT * 3 // 4, lines
    judged = [o for o in outcomes if o.verdict == AGREE]
    assert any(o.scheduler_fits for o in judged) and not all(o.scheduler_fits for o in judged)
