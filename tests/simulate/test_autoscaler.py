"""The cluster-autoscaler strategies against cluster-autoscaler's documented and coded
behaviour, one test per behaviour. Each names its upstream source (kubernetes/autoscaler,
paths under ``cluster-autoscaler/``; flags as in its FAQ.md).

Shared test cloud (``tests/simulate/helpers.py``): one block of two 8-node racks, nodes boot
in exactly 100 s, empty nodes go 600 s after they empty, jobs not running 2 h after submit
are cancelled.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.simulate.autoscaler import BestEffortAtomic, PodByPod
from controller.simulate.engine import SimConfig
from controller.simulate.metrics import StrategyResult
from controller.simulate.runner import run_strategies
from controller.simulate.strategies import make
from controller.simulate.trace import Trace
from tests.simulate.helpers import H, config, trace


def gpu_h(gpus: float, seconds: float) -> float:
    return gpus * seconds / H


def pod_by_pod(jobs: Trace, cfg: SimConfig) -> tuple[PodByPod, StrategyResult]:
    sim = make("pod-by-pod", jobs, cfg)
    assert isinstance(sim, PodByPod)
    return sim, sim.run()


def test_scale_up_waits_for_the_next_loop() -> None:
    # --scan-interval 10s (FAQ "How does scale-up work?"; core/static_autoscaler.go RunOnce):
    # a pod pending at 3 s is seen by the loop at 10 s; its node is ready at 110 s.
    _, r = pod_by_pod(trace((3, H, 8)), config())
    assert r.wait_p50_s == pytest.approx(107)


def test_upcoming_nodes_count_as_capacity() -> None:
    # orchestrator.go puts upcoming nodes in the snapshot before estimating
    # (estimator/binpacking_estimator.go): the pod of job A still waits for its booting
    # node at 20 s, so the loop at 20 s asks one node for job B only, not two.
    sim, _ = pod_by_pod(trace((0, H, 8), (15, H, 8)), config())
    assert sim.nodes_acquired == 2
    assert sim.scale_ups == 2


def test_scale_up_is_capped_by_the_quota_without_backing_off() -> None:
    # orchestrator.go applyLimits: a 3-node gang under a 2-node quota gets 2 nodes
    # (a partial scale-up); a limit is not a failure, so the node group does not back off.
    sim, r = pod_by_pod(trace((0, H, 24)), config(quota_gpus=16))
    assert sim.nodes_acquired == 2
    assert sim.failed_scale_ups == 0
    assert r.timed_out == 1


def test_nodes_the_cloud_cannot_create_back_the_node_group_off() -> None:
    # clusterstate/clusterstate.go handleInstanceCreationErrorsForNodeGroup: 3 of 4 nodes
    # created (rack 0 had 3 in stock), the out-of-resources error backs the group off for
    # --initial-node-group-backoff-duration 5m (utils/backoff/exponential_backoff.go).
    # Stock refills at 60 s, but the next scale-up waits for the loop at 310 s: the 4th
    # node is ready at 410 s, when the gang starts.
    cfg = config(initial_stock=(3, 0), refill_prob=1.0, refill_interval_s=60.0)
    sim, r = pod_by_pod(trace((0, H, 32)), cfg)
    assert sim.failed_scale_ups == 1
    assert r.wait_p50_s == pytest.approx(410)
    # 3 nodes held by a gang that cannot run yet, from 110 s (ready) to 410 s.
    assert r.stranded_waiting_gpu_h == pytest.approx(gpu_h(24, 410 - 110))


def test_backoff_doubles_while_the_cloud_stays_out_of_stock() -> None:
    # exponential_backoff.go: 5 min, then 10 min, 20 min (max 30 min) for failures that
    # come once the previous backoff is over. No stock until 1000 s: failures at 10 s
    # (backoff to 310 s), 310 s (to 910 s), 910 s (to 2110 s); the loop at 2110 s gets the
    # node, ready at 2210 s.
    cfg = config(initial_stock=(0, 0), refill_prob=1.0, refill_interval_s=1000.0)
    sim, r = pod_by_pod(trace((0, H, 8)), cfg)
    assert sim.failed_scale_ups == 3
    assert r.wait_p50_s == pytest.approx(2210)


def test_silently_missing_nodes_block_scale_up_until_max_node_provision_time() -> None:
    # clusterstate.go updateScaleRequests: nodes that never register count as upcoming
    # until --max-node-provision-time 15m; then the scale-up fails and the group backs off
    # (5 min). Same cloud as above: the 4th node is asked at 1210 s, ready at 1310 s.
    cfg = config(initial_stock=(3, 0), refill_prob=1.0, refill_interval_s=60.0)
    cfg = replace(cfg, stockout_reported=False)
    sim, r = pod_by_pod(trace((0, H, 32)), cfg)
    assert sim.failed_scale_ups == 1
    assert r.wait_p50_s == pytest.approx(1310)


def test_no_scale_down_within_the_delay_after_a_scale_up() -> None:
    # core/static_autoscaler.go isScaleDownInCooldown: --scale-down-delay-after-add.
    # A 1-GPU job of 100 s: its node (asked at 10 s) is empty from 210 s and unneeded
    # from 810 s, but with a 3000 s delay it goes only at 10 + 3000 s. Muster releases its
    # own nodes and has no such cooldown: its node goes at 200 + 600 s.
    jobs = trace((0, 100, 1))
    cfg = replace(config(), scale_down_delay_after_add_s=3000.0)
    muster, pbp = run_strategies(jobs, cfg, ["muster", "pod-by-pod"])
    assert pbp.paid_gpu_h == pytest.approx(gpu_h(8, 3010 - 10))
    assert muster.paid_gpu_h == pytest.approx(gpu_h(8, 800))


def test_bound_pods_of_a_gang_hold_their_nodes_and_the_deadlock_is_counted() -> None:
    # kube-scheduler binds pod by pod; bound pods of an incomplete gang keep their node
    # (not empty, so never scaled down). Two 4-node gangs, quota 6 nodes: each binds 3
    # pods at 110 s and waits for the other's nodes: a deadlock, checked every 60 s from
    # 170 s to 7190 s (118 checks) while each holds 24 GPUs; muster has none.
    jobs = trace((0, H, 32), (0, H, 32))
    muster, pbp, bea = run_strategies(
        jobs, config(quota_gpus=48), ["muster", "pod-by-pod", "best-effort-atomic"]
    )
    assert pbp.gangs_deadlocked == 2
    assert pbp.deadlocked_gpu_h == pytest.approx(gpu_h(48 * 60, 118))
    assert (muster.gangs_deadlocked, muster.deadlocked_gpu_h) == (0, 0)
    # best-effort-atomic: the first request gets 4 nodes, the second cannot get all 4
    # (quota) and waits: no deadlock, both run one after the other.
    assert (bea.gangs_deadlocked, bea.started) == (0, 2)


def test_best_effort_atomic_provisions_one_request_per_loop() -> None:
    # besteffortatomic/provisioning_class.go "Pick 1 ProvisioningRequest" and
    # processors/provreq/injector.go: two gangs submitted at 0 s are provisioned at 10 s
    # and 20 s; Provisioned=True before the nodes are ready, pods bind when they are.
    jobs = trace((0, H, 16), (0, H, 16))
    sim = make("best-effort-atomic", jobs, config())
    assert isinstance(sim, BestEffortAtomic)
    r = sim.run()
    assert (r.wait_p50_s, r.wait_p99_s) == (pytest.approx(110), pytest.approx(120))
    assert sim.provreq_attempts == 2


def test_best_effort_atomic_asks_for_all_nodes_or_none() -> None:
    # orchestrator.go allOrNothing: when the quota allows fewer nodes than the request
    # needs, nothing is asked for (pod-by-pod asks for what the quota allows).
    jobs = trace((0, H, 32))
    bea, pbp = run_strategies(jobs, config(quota_gpus=24), ["best-effort-atomic", "pod-by-pod"])
    assert (bea.paid_gpu_h, bea.timed_out) == (0, 1)
    assert pbp.nodes_acquired == 3


def test_atomic_increase_size_fails_on_a_stock_out_and_retries_with_backoff() -> None:
    # executor.go: AtomicIncreaseSize fails when the cloud cannot give all 4 nodes (3 in
    # stock): the group backs off to 310 s and the request retries after 1 min, then 2,
    # 4 min (--provisioning-request-initial-backoff-time 1m, max 10m). Stock suffices from
    # 60 s, the group is backed off until 310 s: attempts at 10, 70 and 190 s fail, the
    # one at 430 s gets the nodes, ready at 530 s.
    cfg = config(initial_stock=(3, 0), refill_prob=1.0, refill_interval_s=60.0)
    sim = make("best-effort-atomic", trace((0, H, 32)), cfg)
    assert isinstance(sim, BestEffortAtomic)
    r = sim.run()
    assert sim.failed_scale_ups == 1
    assert sim.provreq_attempts == 4
    assert r.wait_p50_s == pytest.approx(530)
    assert r.stranded_waiting_gpu_h == 0


def test_best_effort_without_atomic_increase_size_can_strand_a_partial_gang() -> None:
    # executor.go increaseSize: without AtomicIncreaseSize the class falls back to
    # IncreaseSize; the call succeeds, so the request is Provisioned, but the cloud creates
    # 3 of 4 nodes. The 3 pods bound at 110 s hold their nodes until the job is cancelled
    # at 7200 s (+30 s grace).
    cfg = replace(config(initial_stock=(3, 0)), provreq_atomic=False)
    r = make("best-effort-atomic", trace((0, H, 32)), cfg).run()
    assert r.timed_out == 1
    assert r.stranded_waiting_gpu_h == pytest.approx(gpu_h(24, 7230 - 110))


def test_a_newer_pod_binds_while_an_older_one_backs_off() -> None:
    # kube-scheduler's queue (podInitialBackoffSeconds 1, podMaxBackoffSeconds 10): a pod
    # that found no node backs off 1, 2, 4 s... after each failed try, and pods out of
    # backoff are tried first. Quota 1 node: X and Y (4 GPUs each) share it from 110 s.
    # A (8 GPUs, at 200 s) fails at 200, 1110 (X ends) and 1119 s (B arrives), so it backs
    # off until 1123 s; B (8 GPUs) failed once at 1119 s, until 1120 s. When Y ends at
    # 1120 s the node goes to B, the newer job; A gets it when B ends at 1220 s.
    jobs = trace((0, 1000, 4), (0, 1010, 4), (200, H, 8), (1119, 100, 8))
    sim, _ = pod_by_pod(jobs, config(quota_gpus=8))
    starts = {run.job.seq: run.start for run in sim.runs}
    assert starts[3] == pytest.approx(1120)
    assert starts[2] == pytest.approx(1220)
