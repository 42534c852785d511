"""Hand-made traces whose outcome under each strategy is computed by hand in the comments.

Shared mechanics (see ``controller.simulate.engine``): nodes boot in exactly 100 s, are paid
from the request on, and an empty node is released 600 s after it empties; pod-by-pod asks
for nodes at the next 10-second scan; a job not running 2 h after submit is cancelled and its
bound pods hold their GPUs 30 s more.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest

from controller.commands.simulate import simulate_command
from controller.config import RetryConfig
from controller.simulate.engine import SimConfig
from controller.simulate.runner import run_strategies
from controller.simulate.strategies import make
from tests.simulate.helpers import H, config, trace


def gpu_h(gpus: float, seconds: float) -> float:
    return gpus * seconds / H


def test_two_gangs_deadlock_pod_by_pod_but_run_one_after_the_other_under_muster() -> None:
    # Two 32-GPU gangs (4 pods of 8 GPUs) arrive together; the quota holds 6 nodes.
    jobs = trace((0, H, 32), (0, H, 32))
    cfg = config(quota_gpus=48)
    muster, pbp = run_strategies(jobs, cfg, ["muster", "pod-by-pod"])

    # pod-by-pod: the scan at 10 s asks for 8 nodes and gets 6 (quota); they are ready at 110 s
    # and the interleaved pods bind A0 B0 A1 B1 A2 B2: each gang has 3 of 4 pods and never
    # runs. Both are cancelled at 7200 s, their pods go at 7230 s, the 6 nodes at 7830 s.
    assert (pbp.started, pbp.timed_out, pbp.never_started) == (0, 2, 2)
    assert pbp.paid_gpu_h == pytest.approx(gpu_h(48, 7830 - 10))
    assert pbp.used_gpu_h == 0
    assert pbp.stranded_waiting_gpu_h == pytest.approx(gpu_h(48, 7230 - 110))
    assert pbp.stranded_booting_gpu_h == pytest.approx(gpu_h(48, 100))
    assert pbp.stranded_idle_gpu_h == pytest.approx(gpu_h(48, 600))

    # muster: gang A gets 4 nodes at once (ready at 100 s, runs to 3700 s); gang B fits only
    # when A is done and starts at 3700 s on A's nodes; they are released at 7300 + 600 s.
    assert (muster.started, muster.never_started) == (2, 0)
    assert muster.paid_gpu_h == pytest.approx(gpu_h(32, 7900))
    assert muster.used_gpu_h == pytest.approx(gpu_h(32, 2 * H))
    assert muster.stranded_gpu_h == pytest.approx(gpu_h(32, 100 + 600))
    assert muster.stranded_waiting_gpu_h == 0
    assert (muster.wait_p50_s, muster.wait_p99_s) == (100, 3700)
    assert muster.gangs_one_rack == 2


def test_stock_out_partial_nodes_under_pod_by_pod_muster_waits_for_refill() -> None:
    # One 32-GPU gang; rack 0 has 3 nodes in stock, rack 1 none. Every 1800 s other tenants
    # free one node per rack (refill_prob 1).
    jobs = trace((0, H, 32))
    cfg = config(initial_stock=(3, 0), refill_prob=1.0, refill_interval_s=1800.0)
    muster, pbp = run_strategies(jobs, cfg, ["muster", "pod-by-pod"])

    # pod-by-pod asks for 4 at 10 s and gets the 3 in stock (ready 110 s, 3 pods bound); the
    # missing node backs the node group off (5 min), and the empty-handed retries at 310 s
    # and 910 s double it (10, 20 min): the refill at 1800 s is used by the loop at 2110 s
    # (ready 2210 s). The gang runs 2210..5810 s; all four nodes go at 6410 s.
    assert pbp.nodes_acquired == 4
    assert pbp.wait_p50_s == pytest.approx(2210)
    assert pbp.paid_gpu_h == pytest.approx(gpu_h(24, 6410 - 10) + gpu_h(8, 6410 - 2110))
    assert pbp.stranded_waiting_gpu_h == pytest.approx(gpu_h(24, 2210 - 110))
    assert pbp.stranded_booting_gpu_h == pytest.approx(gpu_h(32, 100))
    assert pbp.stranded_idle_gpu_h == pytest.approx(gpu_h(32, 600))

    # muster buys nothing while no rack or block holds 4; at 1800 s rack 0 has 4 and the
    # gang gets them at once (ready 1900 s, runs to 5500 s, released at 6100 s).
    assert muster.nodes_acquired == 4
    assert muster.wait_p50_s == pytest.approx(1900)
    assert muster.paid_gpu_h == pytest.approx(gpu_h(32, 6100 - 1800))
    assert muster.stranded_gpu_h == pytest.approx(gpu_h(32, 100 + 600))
    assert muster.gangs_one_rack == 1


def test_a_job_needing_exactly_one_rack_lands_in_the_one_rack_that_holds_it() -> None:
    # 64 GPUs = 8 nodes = one full rack. Rack 0 has 5 nodes in stock, rack 1 all 8.
    jobs = trace((0, H, 64))
    sim = make("muster", jobs, config(initial_stock=(5, 8)))
    placed: list[set[str]] = []
    commit = sim._commit  # type: ignore[attr-defined]

    def spy(run, plan):  # type: ignore[no-untyped-def]
        placed.append({dict(nn.domain)["topology.muster.dev/rack"] for nn in plan.new_nodes})
        commit(run, plan)

    sim._commit = spy  # type: ignore[attr-defined]
    result = sim.run()
    assert placed == [{"b0-r1"}]
    assert (result.gangs_started, result.gangs_one_rack, result.gangs_cross_block) == (1, 1, 0)
    assert result.wait_p50_s == 100


def test_muster_falls_back_to_one_block_when_no_rack_holds_the_gang() -> None:
    jobs = trace((0, H, 64))
    result = make("muster", jobs, config(initial_stock=(7, 7))).run()
    assert (result.gangs_started, result.gangs_one_rack, result.gangs_cross_block) == (1, 0, 0)
    # Same block: no slowdown, so it runs 100..3700 s and the nodes go at 4300 s.
    assert result.used_gpu_h == pytest.approx(gpu_h(64, H))
    assert result.paid_gpu_h == pytest.approx(gpu_h(64, 4300))


def test_gang_spread_over_blocks_runs_slower_and_muster_refuses_it() -> None:
    # Two blocks of one 4-node rack: an 8-node gang cannot stay in one block.
    jobs = trace((0, H, 64))
    cfg = config(blocks=2, racks_per_block=1, nodes_per_rack=4, initial_stock=(4, 4))
    cfg = replace(cfg, cross_block_slowdown=1.5)
    muster, blind = run_strategies(jobs, cfg, ["muster", "gang-no-topology"])
    assert (muster.never_fits, muster.started, muster.paid_gpu_h) == (1, 0, 0)
    assert blind.gangs_cross_block == 1
    assert blind.used_gpu_h == pytest.approx(gpu_h(64, 1.5 * H))
    assert blind.slowdown_gpu_h == pytest.approx(gpu_h(64, 0.5 * H))


def test_metric_definitions_on_one_small_job() -> None:
    # One 2-GPU job of 1 h: one pod on one 8-GPU node.
    jobs = trace((0, H, 2))
    muster, pbp, blind = run_strategies(
        jobs, config(), ["muster", "pod-by-pod", "gang-no-topology"]
    )
    # muster: node requested at 0, ready at 100, job 100..3700, node released at 4300.
    # paid 8 GPUs x 4300 s; used 2 x 3600; idle = 6 GPUs while it runs + 8 for 600 s.
    for r, t0 in ((muster, 0.0), (blind, 0.0), (pbp, 10.0)):
        assert r.paid_gpu_h == pytest.approx(gpu_h(8, 4300)), r.strategy
        assert r.used_gpu_h == pytest.approx(gpu_h(2, H))
        assert r.stranded_gpu_h == pytest.approx(r.paid_gpu_h - r.used_gpu_h)
        assert r.stranded_booting_gpu_h == pytest.approx(gpu_h(8, 100))
        assert r.stranded_idle_gpu_h == pytest.approx(gpu_h(6, H) + gpu_h(8, 600))
        assert r.stranded_waiting_gpu_h == 0
        assert r.wait_p50_s == pytest.approx(t0 + 100)
        assert r.cost == pytest.approx(r.paid_gpu_h * 2.5)
        assert r.end_s == pytest.approx(t0 + 4300)
    assert pbp.gangs == 0 and pbp.one_rack_fraction is None


def test_small_jobs_share_a_node() -> None:
    # Four 2-GPU jobs submitted 1 s apart fill one node under every strategy.
    jobs = trace((0, H, 2), (1, H, 2), (2, H, 2), (3, H, 2))
    for r in run_strategies(jobs, config()):
        assert r.nodes_acquired == 1, r.strategy
        assert r.used_gpu_h == pytest.approx(gpu_h(8, H))


def test_gang_larger_than_the_quota_strands_partial_nodes_until_cancelled() -> None:
    # A 32-GPU gang under a 16-GPU quota can never run.
    jobs = trace((0, H, 32))
    muster, pbp = run_strategies(jobs, config(quota_gpus=16), ["muster", "pod-by-pod"])
    # muster never buys a node for it.
    assert (muster.never_fits, muster.paid_gpu_h) == (1, 0)
    # pod-by-pod gets 2 of 4 nodes (quota) at 10 s, binds 2 pods at 110 s, and holds them
    # until the job is cancelled at 7200 s (+30 s grace); the nodes go at 7830 s.
    assert (pbp.timed_out, pbp.never_fits) == (1, 0)
    assert pbp.paid_gpu_h == pytest.approx(gpu_h(16, 7830 - 10))
    assert pbp.stranded_waiting_gpu_h == pytest.approx(gpu_h(16, 7230 - 110))


def test_small_jobs_backfill_while_a_gang_waits_for_room() -> None:
    # Quota 4 nodes. A 2-node gang A runs 100..3700 s; a 4-node gang B (submitted at 10 s)
    # has room for only 2 more nodes and waits; a 1-GPU job C submitted after B still starts
    # at once on a third node (backfill: 120..3720 s).
    jobs = trace((0, H, 16), (10, H, 32), (20, H, 1))
    muster = run_strategies(jobs, config(quota_gpus=32), ["muster"])[0]
    # At 3700 s B has A's 2 nodes and room for 1: not enough. At 3720 s C's node is empty
    # too: 3 nodes plus 1 new one in the same rack, ready at 3820 s. B waited 3810 s.
    assert muster.started == 3
    assert muster.wait_p50_s == pytest.approx(100)
    assert muster.wait_p99_s == pytest.approx(3820 - 10)
    assert muster.gangs_one_rack == 2


def test_muster_relax_spreads_a_gang_after_its_bounded_wait() -> None:
    # Two blocks of one 4-node rack: an 8-node gang fits no block. muster never starts it;
    # muster-relax asks for one rack or block until it has waited 900 s, then for the most
    # compact placement anywhere (preferred topology): nodes at 900 s, ready at 1000 s,
    # running 1.5x slower across the two blocks.
    jobs = trace((0, H, 64))
    cfg = config(blocks=2, racks_per_block=1, nodes_per_rack=4, initial_stock=(4, 4))
    cfg = replace(cfg, cross_block_slowdown=1.5)
    muster, relax = run_strategies(jobs, cfg, ["muster", "muster-relax"])
    assert (muster.never_fits, muster.started) == (1, 0)
    assert (relax.started, relax.gangs_cross_block) == (1, 1)
    assert relax.wait_p50_s == pytest.approx(1000)
    assert relax.used_gpu_h == pytest.approx(gpu_h(64, 1.5 * H))


def test_muster_relax_keeps_the_rack_when_one_frees_up_in_time() -> None:
    # Rack 0 has 2 nodes in stock, rack 1 none; every 600 s each rack's other tenants free
    # one. A 3-node gang gets rack 0's third node at 600 s, before its 900 s bound: it
    # stays in one rack, exactly as under muster.
    jobs = trace((0, H, 24))
    cfg = config(initial_stock=(2, 0), refill_prob=1.0, refill_interval_s=600.0)
    muster, relax = run_strategies(jobs, cfg, ["muster", "muster-relax"])
    for r in (muster, relax):
        assert (r.gangs_one_rack, r.wait_p50_s) == (1, pytest.approx(700)), r.strategy


def test_muster_relax_can_reserve_capacity_for_a_gang_that_waited_too_long() -> None:
    # Quota 3 nodes. A (1 node, 1 h) runs 100..3700 s; gang G (3 nodes) arrives at 5 s and
    # cannot fit; B (1 node) arrives at 1000 s.
    jobs = trace((0, H, 8), (5, H, 24), (1000, H, 8))
    cfg = replace(config(quota_gpus=24), reserve_s=8 * H)
    muster, relax = run_strategies(jobs, cfg, ["muster", "muster-relax"])
    # muster backfills B (ready 1100 s, runs to 4700 s); G needs 3 nodes at once and gets
    # them only when B ends: B's node plus 2 new ones, ready at 4800 s.
    assert muster.gang_wait_p50_s == pytest.approx(4800 - 5)
    assert muster.wait_p50_s == pytest.approx(100)
    # muster-relax: G has waited 900 s at 905 s and holds a reservation, so B (which needs
    # an empty node) waits; at 3700 s G takes A's node plus 2 new ones (ready 3800 s) and
    # B starts when G ends, at 7400 s.
    assert relax.gang_wait_p50_s == pytest.approx(3800 - 5)
    assert relax.wait_p99_s == pytest.approx(7400 - 1000)



def test_muster_shipped_reserves_for_a_gang_past_its_wait_only_when_configured_to() -> None:
    # The trace of the muster-relax test above, under the controller's policy: relaxation
    # after 900 s, and topology.reserve_seconds (off by default).
    jobs = trace((0, H, 8), (5, H, 24), (1000, H, 8))
    cfg = replace(config(quota_gpus=24), shipped_relax_after_s=900.0)
    assert SimConfig().shipped_reserve_s == 0.0  # the controller's default: off
    off = make("muster-shipped", jobs, cfg).run()
    # Off: B takes a new node at 1000 s; G gets B's and A's nodes plus a new one when B ends.
    assert off.gang_wait_p50_s == pytest.approx(4800 - 5)
    assert off.wait_p50_s == pytest.approx(100)
    on = make("muster-shipped", jobs, replace(cfg, shipped_reserve_s=8 * H)).run()
    # On: B (younger, needs an empty node) waits; A's pods end at 3700 s and the wake-up
    # gives G A's node plus 2 new ones (ready 3800 s); B starts when G ends, at 7400 s.
    assert on.gang_wait_p50_s == pytest.approx(3800 - 5)
    assert on.wait_p99_s == pytest.approx(7400 - 1000)


def test_muster_retry_plans_each_request_on_its_own_backoff_not_in_arrival_order() -> None:
    # Quota 1 node. A runs 100..1100 s; B (10 s) and C (500 s) need the whole node too.
    jobs = trace((0, 1000, 8), (10, 1000, 8), (500, 1000, 8))
    cfg = replace(config(quota_gpus=8), retry_max_s=300.0, retry_attempts=100)
    fifo, retry = make("muster", jobs, cfg), make("muster-retry", jobs, cfg)
    fifo_result, retry_result = fifo.run(), retry.run()
    # muster (arrival order): B takes the node the moment A ends, C after B.
    assert [r.start for r in fifo.runs] == [100, 1100, 2100]
    # muster-retry (the controller's backoff, 10 s doubling to a cap of 300 s here): B is
    # planned at 10, 20, 40, 80, 160, 320, 620, 920, 1220 s; C at 500, 510, 530, 570, 650,
    # 810, 1110 s. The node is empty from 1100 s and C's retry comes first: C starts at
    # 1110 s, B at its retry at 2120 s (1220 + 3 x 300 s), after C ends at 2110 s.
    assert [r.start for r in retry.runs] == [100, 2120, 1110]
    # The node idles until a retry comes (10 s after A, 10 s after C), on top of the
    # 600 s before it is released.
    assert retry_result.stranded_idle_gpu_h == pytest.approx(
        fifo_result.stranded_idle_gpu_h + gpu_h(8, 20)
    )


def test_muster_retry_fails_a_request_after_the_controllers_max_attempts() -> None:
    # Quota 1 node. A runs 100..1100 s; B (10 s) needs the whole node. With a 300 s cap B is
    # planned at 10, 20, 40, 80, 160, 320, 620, 920 s, then 1220 s, when A's node is empty
    # (kept until 1700 s). The controller marks a request Failed when attempt max_attempts
    # finds nothing (ProvisioningService.retry_or_fail), so with 8 attempts B never starts.
    jobs = trace((0, 1000, 8), (10, 1000, 8))
    cfg = replace(config(quota_gpus=8), retry_max_s=300.0)
    eight = make("muster-retry", jobs, replace(cfg, retry_attempts=8))
    r = eight.run()
    assert (r.started, r.never_started, r.failed, r.timed_out) == (1, 1, 1, 0)
    # Each attempt that found nothing costs the controller two writes of the request; three
    # of them (10, 20, 40 s) fall in the first minute.
    assert (r.retries, r.retries_peak_per_min) == (8, 3)
    assert eight.runs[0].start == 100 and eight.runs[1].start < 0
    # B gave up at 920 s: nothing waits, so A's node goes 600 s after A ends.
    assert r.paid_gpu_h == pytest.approx(gpu_h(8, 1700))
    # Nine attempts reach the empty node: B starts at its ninth, 1220 s.
    nine = make("muster-retry", jobs, replace(cfg, retry_attempts=9))
    r = nine.run()
    assert (r.started, r.failed, r.retries) == (2, 0, 8)
    assert nine.runs[1].start == 1220
    # muster (a queue in front) never fails a request: only the start timeout ends a wait.
    (fifo,) = run_strategies(jobs, replace(cfg, retry_attempts=1), ["muster"])
    assert (fifo.started, fifo.failed) == (2, 0)


def test_muster_retry_uses_the_controllers_retry_defaults() -> None:
    # The simulator (and its command line) models the controller's schedule and failure
    # budget, not its own idea of them.
    sim, controller = SimConfig(), RetryConfig()
    assert (sim.retry_initial_s, sim.retry_max_s, sim.retry_attempts) == (
        controller.initial_backoff_seconds, controller.max_backoff_seconds,
        controller.max_attempts,
    )
    options = inspect.signature(simulate_command).parameters
    assert (
        options["retry_initial"].default, options["retry_max"].default,
        options["retry_attempts"].default,
    ) == (sim.retry_initial_s, sim.retry_max_s, sim.retry_attempts)


def test_muster_shipped_plans_waiting_requests_the_moment_capacity_frees() -> None:
    # The trace of the muster-retry test above. As shipped, the controller plans every waiting
    # request again the moment A's pods end (1100 s). In backoff order (the default) the node
    # goes to C, whose timer was due first (1110 s, B's at 1220 s): muster-retry's choice,
    # 10 s sooner; B follows when C ends. In arrival order B takes it, then C: what a FIFO
    # queue gives.
    jobs = trace((0, 1000, 8), (10, 1000, 8), (500, 1000, 8))
    cfg = replace(config(quota_gpus=8), retry_max_s=300.0, retry_attempts=100)
    assert cfg.shipped_replan_order == RetryConfig().replan_order == "backoff"
    shipped = make("muster-shipped", jobs, cfg)
    r = shipped.run()
    assert [run.start for run in shipped.runs] == [100, 2100, 1100]
    fifo = make("muster-shipped", jobs, replace(cfg, shipped_replan_order="arrival"))
    f = fifo.run()
    assert [run.start for run in fifo.runs] == [100, 1100, 2100]
    # The re-plans on a wake-up count no attempt: only the timers' misses do. Backoff order:
    # B at 10 .. 920 s, then 1220, 1520, 1820 s (C holds the node); C at 500 .. 810 s.
    assert r.retries == 8 + 3 + 6
    # Arrival order: B at 10 .. 920 s; C at 500, 510, 530, 570, 650, 810, 1110, 1410, 1710,
    # 2010 s (B holds the node from 1100 s).
    assert f.retries == 8 + 10
    # Stock returning in the cloud is not watched: there the backoff stays.
    assert make("muster-shipped", jobs, replace(cfg, retry_attempts=8)).run().failed == 1


def test_muster_shipped_relaxes_topology_only_when_the_controller_is_configured_to() -> None:
    # The trace of the muster-relax test above (an 8-node gang fits no block).
    jobs = trace((0, H, 64))
    cfg = config(blocks=2, racks_per_block=1, nodes_per_rack=4, initial_stock=(4, 4))
    strict = make("muster-shipped", jobs, cfg).run()
    assert SimConfig().shipped_relax_after_s is None  # the controller's default: never
    assert (strict.never_fits, strict.started) == (1, 0)
    relaxed = make("muster-shipped", jobs, replace(cfg, shipped_relax_after_s=900.0))
    r = relaxed.run()
    # Attempts at 0, 10, 30, 70, 130 .. 850 s (60 s cap), then at 900 s, the relaxation
    # (the next attempt is no later than it): nodes at 900 s, ready at 1000 s.
    assert (r.started, r.gangs_cross_block) == (1, 1)
    assert r.wait_p50_s == pytest.approx(1000)
