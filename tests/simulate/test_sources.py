"""The capacity-sources regime: on demand, reservation first, queued (hand-made traces)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from controller.cli import app
from controller.simulate.cloud import CloudConfig
from controller.simulate.sources import SourcesConfig, SourcesSimulation, run_sources
from tests.simulate.helpers import H, trace

# Two racks of 4 nodes with no stock at all: on demand can give nothing.
EMPTY = CloudConfig(blocks=1, racks_per_block=2, nodes_per_rack=4, quota_gpus=128,
                    initial_stock=(0, 0), refill_prob=0.0, drain_prob=0.0,
                    boot_min_s=100.0, boot_max_s=100.0)
FULL = CloudConfig(blocks=1, racks_per_block=2, nodes_per_rack=4, quota_gpus=128,
                   initial_stock=(4, 4), refill_prob=0.0, drain_prob=0.0,
                   boot_min_s=100.0, boot_max_s=100.0)


def run(strategy: str, cloud: CloudConfig, *jobs: tuple[float, float, int],
        **kw: Any) -> SourcesSimulation:
    config = replace(SourcesConfig(cloud=cloud), **kw)
    sim = SourcesSimulation(strategy, trace(*jobs), config)
    sim.run()
    return sim


def test_a_gang_goes_into_the_reservation_when_it_holds_it_whole() -> None:
    # Quota 16 nodes, half reserved: 8 reserved nodes. A 4-node gang fits there.
    sim = run("reservation-first", EMPTY, (0, H, 32), reserved_share=0.5)
    r = sim.result
    assert (r.started, r.from_reservation, r.on_demand) == (1, 1, 0)
    assert r.waits_s == [0.0]
    # The reservation is paid for the whole replay, used or not: 8 nodes x 1 h.
    assert r.paid_gpu_h == pytest.approx(8 * 8 * 1.0)
    assert r.reserved_idle_gpu_h == pytest.approx(8 * 8 - 32)


def test_a_reservation_too_small_for_the_gang_is_not_used_partly() -> None:
    # 2 reserved nodes, a 4-node gang: it waits for on demand (none) and never starts.
    sim = run("reservation-first", EMPTY, (0, H, 32), reserved_share=0.125)
    assert sim.result.from_reservation == 0 and sim.result.never_started == 1
    assert sim.reserved_free == 2
    # With stock, the same gang goes on demand whole.
    sim = run("reservation-first", FULL, (0, H, 32), reserved_share=0.125)
    assert (sim.result.from_reservation, sim.result.on_demand) == (0, 1)


def test_on_demand_only_waits_for_stock_and_queued_waits_for_the_grant() -> None:
    r_od = run("on-demand-only", EMPTY, (0, H, 8)).result
    assert r_od.never_started == 1
    r_q = run("queued", EMPTY, (0, H, 8), queue_delay_s=1800.0).result
    assert r_q.started == 1 and r_q.queued == 1 and r_q.waits_s[0] > 100.0
    # Queued capacity is paid at its own price: one node-hour and its boot at 0.6.
    assert r_q.cost == pytest.approx(8 * (H + 100.0) / H * 2.5 * 0.6)


def test_a_job_longer_than_the_queue_s_maximum_run_goes_on_demand() -> None:
    r = run("queued", FULL, (0, 8 * 24 * H, 8)).result
    assert (r.queued, r.on_demand) == (0, 1)


def test_strategies_see_the_same_other_tenants() -> None:
    cloud = CloudConfig(blocks=1, racks_per_block=2, nodes_per_rack=4, quota_gpus=128,
                        refill_prob=0.5, drain_prob=0.5)
    jobs = trace(*[(i * 600.0, 2 * H, 16) for i in range(30)])
    a = run_sources(jobs, SourcesConfig(cloud=cloud, seed=3))
    b = run_sources(jobs, SourcesConfig(cloud=cloud, seed=3))
    assert [x.waits_s for x in a] == [x.waits_s for x in b]


def test_the_cli_prints_the_table_and_refuses_a_bad_share(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                    "2017-10-01 00:00:00,3600,16,57600,a\n")
    runner = CliRunner()
    ok = runner.invoke(app, ["simulate", "--trace", str(path), "--capacity-sources"])
    assert ok.exit_code == 0, ok.output
    assert ok.output.count("\n| ") == 3  # one row per strategy
    assert "| reservation-first | 1 | 1 |" in ok.output
    bad = runner.invoke(app, ["simulate", "--trace", str(path), "--capacity-sources",
                              "--reserved-share", "1.5"])
    assert bad.exit_code == 2 and "reserved share must be in [0, 1]" in bad.output
    wrong = runner.invoke(app, ["simulate", "--trace", str(path), "--capacity-sources",
                                "--strategy", "muster"])
    assert wrong.exit_code == 2 and "unknown strategy muster" in wrong.output
