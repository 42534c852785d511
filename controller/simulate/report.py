"""Output of ``muster simulate``: a rich table, a Markdown table (for the documentation), JSON and
the one-line summary. Charts are in :mod:`controller.simulate.plots`, the only module that
needs matplotlib."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from rich.table import Table

from controller.simulate.engine import SimConfig
from controller.simulate.metrics import StrategyResult
from controller.simulate.trace import Trace


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def rows(results: Sequence[StrategyResult]) -> list[tuple[str, list[str]]]:
    """(metric, one cell per strategy), shared by the rich and the Markdown table."""

    def each(fn: Any) -> list[str]:
        return [fn(r) for r in results]

    return [
        ("jobs", each(lambda r: f"{r.jobs:,}")),
        ("jobs started", each(lambda r: f"{r.started:,}")),
        (
            "never started (timeout / never fits / failed)",
            each(lambda r: f"{r.never_started:,} ({r.timed_out:,} / {r.never_fits:,} / "
                 f"{r.failed:,})"),
        ),
        ("GPU-hours paid", each(lambda r: f"{r.paid_gpu_h:,.0f}")),
        ("GPU-hours used by running jobs", each(lambda r: f"{r.used_gpu_h:,.0f}")),
        (
            "used: extra run time of gangs across blocks",
            each(lambda r: f"{r.slowdown_gpu_h:,.0f}"),
        ),
        (
            "GPU-hours stranded (share of paid)",
            each(lambda r: f"{r.stranded_gpu_h:,.0f} ({_pct(r.stranded_gpu_h, r.paid_gpu_h)})"),
        ),
        (
            "stranded: held by jobs not running yet",
            each(lambda r: f"{r.stranded_waiting_gpu_h:,.0f}"),
        ),
        ("stranded: idle on ready nodes", each(lambda r: f"{r.stranded_idle_gpu_h:,.0f}")),
        ("stranded: booting nodes", each(lambda r: f"{r.stranded_booting_gpu_h:,.0f}")),
        ("cost", each(lambda r: f"${r.cost:,.0f}")),
        (
            "job wait p50 / p95 / p99",
            each(
                lambda r: " / ".join(
                    _duration(v) for v in (r.wait_p50_s, r.wait_p95_s, r.wait_p99_s)
                )
            ),
        ),
        (
            "gang wait p50 / p95 / p99",
            each(
                lambda r: " / ".join(
                    _duration(v) for v in (r.gang_wait_p50_s, r.gang_wait_p95_s, r.gang_wait_p99_s)
                )
            ),
        ),
        (
            "gangs started / in one rack / across blocks",
            each(
                lambda r: f"{r.gangs_started:,} / "
                f"{_pct(r.gangs_one_rack, r.gangs_started)} / {r.gangs_cross_block:,}"
            ),
        ),
        (
            "gangs deadlocked / GPU-hours they held",
            each(lambda r: f"{r.gangs_deadlocked:,} / {r.deadlocked_gpu_h:,.0f}"),
        ),
        (
            "nodes acquired / peak GPUs paid",
            each(lambda r: f"{r.nodes_acquired:,} / {r.peak_paid_gpus:,}"),
        ),
    ]


def title(trace: Trace, config: SimConfig) -> str:
    cc = config.cloud
    return (
        f"{len(trace.jobs):,} jobs from {trace.source}, seed {config.seed}; "
        f"quota {cc.quota_gpus} GPUs, {cc.blocks}x{cc.racks_per_block} racks of "
        f"{cc.nodes_per_rack} x {cc.gpus_per_node}-GPU nodes, ${config.price_per_gpu_hour}/GPU-h"
    )


def rich_table(results: Sequence[StrategyResult], trace: Trace, config: SimConfig) -> Table:
    table = Table(title=title(trace, config), title_justify="left")
    table.add_column("metric")
    for r in results:
        table.add_column(r.strategy, justify="right")
    for metric, cells in rows(results):
        table.add_row(metric, *cells)
    return table


def markdown_table(results: Sequence[StrategyResult]) -> str:
    head = "| metric | " + " | ".join(r.strategy for r in results) + " |"
    rule = "| --- |" + " ---: |" * len(results)
    body = [
        "| " + metric + " | " + " | ".join(cells) + " |" for metric, cells in rows(results)
    ]
    return "\n".join([head, rule, *body])


def to_json(results: Sequence[StrategyResult], trace: Trace, config: SimConfig) -> dict[str, Any]:
    config_data = asdict(config)
    cloud = config_data["cloud"]
    if cloud.get("initial_stock") is not None:
        cloud["initial_stock"] = list(cloud["initial_stock"])
    return {
        "trace": {
            "source": trace.source,
            "jobs": len(trace.jobs),
            "first_submit": trace.origin.isoformat() if trace.jobs else None,
            "span_days": trace.span_seconds / 86400.0,
        },
        "config": config_data,
        "strategies": {r.strategy: r.to_json() for r in results},
    }


def summary_line(results: Sequence[StrategyResult]) -> str:
    """``simulate jobs=<n> muster_stranded_gpu_h=<a> podbypod_stranded_gpu_h=<b>
    muster_paid_gpu_h=<c> podbypod_paid_gpu_h=<d>``; needs both strategies."""
    by_name = {r.strategy: r for r in results}
    muster, pbp = by_name["muster"], by_name["pod-by-pod"]
    return (
        f"simulate jobs={muster.jobs} "
        f"muster_stranded_gpu_h={muster.stranded_gpu_h:.1f} "
        f"podbypod_stranded_gpu_h={pbp.stranded_gpu_h:.1f} "
        f"muster_paid_gpu_h={muster.paid_gpu_h:.1f} "
        f"podbypod_paid_gpu_h={pbp.paid_gpu_h:.1f}"
    )
