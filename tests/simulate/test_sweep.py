"""The sweep's trace transforms and cloud sizing."""

from __future__ import annotations

from controller.simulate import sweep as sw
from tests.simulate.helpers import H, trace


def test_cut_keeps_a_window_and_renumbers_it() -> None:
    jobs = trace((0, H, 1), (0.5 * sw.DAY, H, 2), (1.5 * sw.DAY, H, 4), (3 * sw.DAY, H, 8))
    window = sw.cut(jobs, 0.4 * sw.DAY, 2)
    assert [(j.seq, j.submit, j.gpus) for j in window.jobs] == [(0, 0.0, 2), (1, sw.DAY, 4)]


def test_mixes_scale_gpus_and_keep_a_seeded_share() -> None:
    jobs = trace(*((i * 60.0, H, 1 + i % 4) for i in range(400)))
    x4 = sw.mix(jobs, sw.MIXES[1], seed=0)
    assert 60 < len(x4.jobs) < 140  # about 1/4 of 400
    assert all(j.gpus % 4 == 0 for j in x4.jobs)
    assert x4 == sw.mix(jobs, sw.MIXES[1], seed=0)
    gangs = sw.mix(jobs, sw.MIXES[2], seed=0)
    assert len(gangs.jobs) == 300 and min(j.gpus for j in gangs.jobs) == 8
    assert sw.mix(jobs, sw.MIXES[0], seed=0) is jobs


def test_peak_demand_counts_gangs_in_whole_nodes() -> None:
    # A 12-GPU job holds 2 nodes (16 GPUs); with a 3-GPU job beside it: 19 at the peak.
    jobs = trace((0, H, 12), (10, H, 3), (2 * H, H, 1))
    assert sw.peak_demand_gpus(jobs, 8) == 19


def test_scarcity_levels_scale_quota_and_cloud_with_the_peak() -> None:
    spec = sw.SweepSpec()
    ample = sw.level_config(spec, sw.SCARCITY[0], peak_gpus=800, seed=3)
    starved = sw.level_config(spec, sw.SCARCITY[-1], peak_gpus=800, seed=3)
    assert ample.cloud.quota_gpus == 150 * 8 and starved.cloud.quota_gpus == 35 * 8
    # About twice the peak (100 nodes) in node slots, in blocks of 4 racks of 8.
    assert ample.cloud.blocks == starved.cloud.blocks == 7
    assert ample.cloud.initial_stock_min == 8 and starved.cloud.initial_stock_min == 0
    assert starved.cloud.drain_prob > starved.cloud.refill_prob
    assert ample.seed == 3
