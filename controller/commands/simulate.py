"""``muster simulate``: replay a GPU job trace under Muster's and cluster-autoscaler's
provisioning and compare what each pays, uses and strands; ``--sweep`` does it across
supply scarcity and gang-size mixes.

Exit codes: 0 done, 2 bad input (unreadable or malformed trace, nonsensical option) or
the ``simulate`` extra missing (matplotlib, which the image leaves out).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from controller.simulate.engine import SimConfig
    from controller.simulate.metrics import StrategyResult
    from controller.simulate.trace import Trace

EXIT_BAD_INPUT = 2
MISSING_EXTRA = (
    "muster simulate needs the 'simulate' extra (matplotlib): pip install 'muster[simulate]'"
)

_TRACE = "Trace selection"
_CLOUD = "Simulated cloud"
_POLICY = "Policies"
_OUTPUT = "Output"
_SWEEP = "Sweep (--sweep)"
_SOURCES = "Capacity sources (--capacity-sources)"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


def simulate_command(
    trace: Annotated[
        Path,
        typer.Option(
            "--trace", "-t", help="CSV with timestamp, duration, num_gpus, cluster columns."
        ),
    ],
    strategy: Annotated[
        list[str] | None,
        typer.Option(
            "--strategy",
            help="muster, muster-relax, muster-retry, muster-shipped, pod-by-pod, "
            "best-effort-atomic or "
            "gang-no-topology (with --capacity-sources: on-demand-only, reservation-first "
            "or queued); repeat for several (default: all).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of every random draw.")] = 0,
    start: Annotated[
        str | None,
        typer.Option(help="Keep jobs submitted at or after this UTC time.", rich_help_panel=_TRACE),
    ] = None,
    end: Annotated[
        str | None,
        typer.Option(help="Keep jobs submitted before this UTC time.", rich_help_panel=_TRACE),
    ] = None,
    cluster: Annotated[
        list[str] | None,
        typer.Option(help="Keep this virtual cluster (repeatable).", rich_help_panel=_TRACE),
    ] = None,
    sample: Annotated[
        float,
        typer.Option(help="Keep each job with this probability (seeded).", rich_help_panel=_TRACE),
    ] = 1.0,
    limit: Annotated[
        int | None,
        typer.Option(help="Keep at most this many (earliest) jobs.", rich_help_panel=_TRACE),
    ] = None,
    min_gpus: Annotated[
        int,
        typer.Option(help="Keep only jobs of at least this many GPUs.", rich_help_panel=_TRACE),
    ] = 1,
    quota_gpus: Annotated[
        int, typer.Option(help="Most GPUs the cluster may hold.", rich_help_panel=_CLOUD)
    ] = 512,
    blocks: Annotated[int, typer.Option(rich_help_panel=_CLOUD)] = 4,
    racks_per_block: Annotated[int, typer.Option(rich_help_panel=_CLOUD)] = 4,
    nodes_per_rack: Annotated[
        int, typer.Option(help="Node slots per rack (8 GPUs each).", rich_help_panel=_CLOUD)
    ] = 8,
    initial_stock_min: Annotated[
        int,
        typer.Option(help="Each rack starts with a seeded stock between this and nodes per rack.",
                     rich_help_panel=_CLOUD),
    ] = 2,
    refill_interval: Annotated[
        float, typer.Option(help="Seconds between stock changes.", rich_help_panel=_CLOUD)
    ] = 1800.0,
    refill_prob: Annotated[
        float,
        typer.Option(help="Per rack and interval: another tenant frees a node.",
                     rich_help_panel=_CLOUD),
    ] = 0.5,
    drain_prob: Annotated[
        float,
        typer.Option(help="Per rack and interval: another tenant takes a node.",
                     rich_help_panel=_CLOUD),
    ] = 0.3,
    boot_min: Annotated[float, typer.Option(help="Seconds.", rich_help_panel=_CLOUD)] = 90.0,
    boot_max: Annotated[float, typer.Option(help="Seconds.", rich_help_panel=_CLOUD)] = 120.0,
    idle_timeout: Annotated[
        float, typer.Option(help="Empty nodes go after this many seconds.", rich_help_panel=_POLICY)
    ] = 600.0,
    start_timeout: Annotated[
        float,
        typer.Option(help="Jobs not running this many seconds after submit are cancelled.",
                     rich_help_panel=_POLICY),
    ] = 6 * 3600.0,
    cross_block_slowdown: Annotated[
        float,
        typer.Option(help="Run-time factor of a gang spread over blocks.", rich_help_panel=_POLICY),
    ] = 1.3,
    price_per_gpu_hour: Annotated[float, typer.Option(rich_help_panel=_POLICY)] = 2.5,
    relax_after: Annotated[
        float,
        typer.Option(help="muster-relax: seconds a gang waits for one rack or block before "
                     "taking the most compact placement anywhere.", rich_help_panel=_POLICY),
    ] = 900.0,
    reserve: Annotated[
        float,
        typer.Option(help="muster-relax: seconds a gang past --relax-after holds a "
                     "reservation against younger jobs (0: none).", rich_help_panel=_POLICY),
    ] = 0.0,
    retry_initial: Annotated[
        float,
        typer.Option(help="muster-retry: seconds before a request that found no capacity is "
                     "planned again, doubling per attempt (the controller's "
                     "retry.initial_backoff_seconds).", rich_help_panel=_POLICY),
    ] = 10.0,
    retry_max: Annotated[
        float,
        typer.Option(help="muster-retry: cap of that delay (retry.max_backoff_seconds).",
                     rich_help_panel=_POLICY),
    ] = 60.0,
    retry_attempts: Annotated[
        int,
        typer.Option(help="muster-retry: planning attempts before a request is marked Failed "
                     "and its job never starts (retry.max_attempts).", rich_help_panel=_POLICY),
    ] = 720,
    shipped_relax_after: Annotated[
        float | None,
        typer.Option(help="muster-shipped: the controller's topology.relax_after_seconds "
                     "(seconds a gang waits for its required rack or block before the most "
                     "compact placement; default: the controller's default, never).",
                     rich_help_panel=_POLICY),
    ] = None,
    shipped_replan_order: Annotated[
        str | None,
        typer.Option(help="muster-shipped: the controller's retry.replan_order, arrival or "
                     "backoff (default: the controller's default).", rich_help_panel=_POLICY),
    ] = None,
    shipped_reserve: Annotated[
        float | None,
        typer.Option(help="muster-shipped: the controller's topology.reserve_seconds (seconds "
                     "a gang past its relaxation holds a reservation against younger requests; "
                     "default: the controller's default, off).", rich_help_panel=_POLICY),
    ] = None,
    provreq_atomic: Annotated[
        bool,
        typer.Option("--provreq-atomic/--no-provreq-atomic",
                     help="best-effort-atomic: the node group has AtomicIncreaseSize (all or "
                     "none); without it IncreaseSize may give part of the nodes.",
                     rich_help_panel=_POLICY),
    ] = True,
    stockout_reported: Annotated[
        bool,
        typer.Option("--stockout-reported/--stockout-silent",
                     help="cluster-autoscaler learns at once of nodes the cloud could not "
                     "create, or only after max-node-provision-time (15 min).",
                     rich_help_panel=_POLICY),
    ] = True,
    workers: Annotated[
        int | None,
        typer.Option(help="Processes to run strategies (and sweep runs) in (default: CPUs).",
                     rich_help_panel=_OUTPUT),
    ] = None,
    sweep: Annotated[
        bool,
        typer.Option("--sweep", help="Vary supply scarcity and the gang-size mix; write a CSV "
                     "and a PNG and print a Markdown summary.", rich_help_panel=_SWEEP),
    ] = False,
    sweep_dir: Annotated[
        Path, typer.Option(help="Where --sweep writes sweep.csv and sweep.png.",
                           rich_help_panel=_SWEEP)
    ] = Path("muster-sweep"),
    windows: Annotated[
        int, typer.Option(help="Trace windows per sweep point.", rich_help_panel=_SWEEP)
    ] = 2,
    window_days: Annotated[
        float, typer.Option(help="Length of each window in days.", rich_help_panel=_SWEEP)
    ] = 14.0,
    capacity_sources: Annotated[
        bool,
        typer.Option("--capacity-sources",
                     help="Compare where gangs get capacity (on demand, a reservation, the "
                     "cloud's queue) instead; prints a Markdown table.",
                     rich_help_panel=_SOURCES),
    ] = False,
    reserved_share: Annotated[
        float, typer.Option(help="Share of the quota held as a reservation "
                            "(reservation-first).", rich_help_panel=_SOURCES)
    ] = 0.25,
    reserved_price: Annotated[
        float, typer.Option(help="Reserved node-hour price as a share of on-demand (paid "
                            "used or not).", rich_help_panel=_SOURCES)
    ] = 1.0,
    queue_delay: Annotated[
        float, typer.Option(help="Mean seconds before the queue grants a request "
                            "(exponential).", rich_help_panel=_SOURCES)
    ] = 3600.0,
    queue_price: Annotated[
        float, typer.Option(help="Queued node-hour price as a share of on-demand.",
                            rich_help_panel=_SOURCES)
    ] = 0.6,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print JSON instead of the table.", rich_help_panel=_OUTPUT),
    ] = False,
    markdown: Annotated[
        bool,
        typer.Option("--markdown", help="Print a Markdown table instead.", rich_help_panel=_OUTPUT),
    ] = False,
    summary: Annotated[
        bool,
        typer.Option("--summary",
                     help="End with one 'simulate jobs=...' line (needs muster and pod-by-pod).",
                     rich_help_panel=_OUTPUT),
    ] = False,
    plot: Annotated[
        Path | None,
        typer.Option(help="PNG of paid vs used GPUs over time.", rich_help_panel=_OUTPUT),
    ] = Path("muster-simulate.png"),
    no_plot: Annotated[
        bool, typer.Option("--no-plot", help="Do not write the PNG.", rich_help_panel=_OUTPUT)
    ] = False,
) -> None:
    """Replay a GPU job trace and compare gang-atomic, topology-aware provisioning (muster)
    with pod-by-pod autoscaling and gang-atomic provisioning blind to topology."""
    if importlib.util.find_spec("matplotlib") is None:
        raise _fail(MISSING_EXTRA)
    from controller.simulate.cloud import CloudConfig
    from controller.simulate.engine import SimConfig
    from controller.simulate.runner import default_workers, run_strategies
    from controller.simulate.sources import SOURCE_STRATEGIES
    from controller.simulate.strategies import STRATEGIES
    from controller.simulate.trace import TraceError, TraceFilter, load_trace, parse_time

    known = SOURCE_STRATEGIES if capacity_sources else tuple(STRATEGIES)
    strategies = list(dict.fromkeys(strategy)) if strategy else list(known)
    unknown = [s for s in strategies if s not in known]
    if unknown:
        raise _fail(f"unknown strategy {', '.join(unknown)}; choose from {', '.join(known)}")
    if summary and not {"muster", "pod-by-pod"} <= set(strategies):
        raise _fail("--summary compares muster with pod-by-pod: run both strategies")
    try:
        selection = TraceFilter(
            start=parse_time(start) if start else None,
            end=parse_time(end) if end else None,
            clusters=frozenset(cluster or ()),
            sample=sample,
            limit=limit,
            min_gpus=min_gpus,
            seed=seed,
        )
    except ValueError as exc:
        raise _fail(f"--start/--end: {exc}") from None
    config = SimConfig(
        cloud=CloudConfig(
            blocks=blocks,
            racks_per_block=racks_per_block,
            nodes_per_rack=nodes_per_rack,
            quota_gpus=quota_gpus,
            initial_stock_min=initial_stock_min,
            refill_interval_s=refill_interval,
            refill_prob=refill_prob,
            drain_prob=drain_prob,
            boot_min_s=boot_min,
            boot_max_s=boot_max,
        ),
        seed=seed,
        idle_timeout_s=idle_timeout,
        start_timeout_s=start_timeout,
        cross_block_slowdown=cross_block_slowdown,
        price_per_gpu_hour=price_per_gpu_hour,
        relax_after_s=relax_after,
        reserve_s=reserve,
        retry_initial_s=retry_initial,
        retry_max_s=retry_max,
        retry_attempts=retry_attempts,
        shipped_relax_after_s=(shipped_relax_after if shipped_relax_after is not None
                               else SimConfig().shipped_relax_after_s),
        shipped_replan_order=shipped_replan_order or SimConfig().shipped_replan_order,
        shipped_reserve_s=(shipped_reserve if shipped_reserve is not None
                           else SimConfig().shipped_reserve_s),
        provreq_atomic=provreq_atomic,
        stockout_reported=stockout_reported,
    )
    try:
        config.validate()
    except ValueError as exc:
        raise _fail(str(exc)) from None
    try:
        loaded = load_trace(trace, selection)
    except TraceError as exc:
        raise _fail(str(exc)) from None
    if not loaded.jobs:
        raise _fail(f"{trace}: no job left after the trace selection")

    if capacity_sources:
        _sources(loaded, config, strategies, reserved_share=reserved_share,
                 reserved_price=reserved_price, queue_delay=queue_delay,
                 queue_price=queue_price)
        return
    procs = workers if workers is not None else default_workers()
    if procs < 1:
        raise _fail(f"--workers must be >= 1, got {procs}")
    if sweep:
        _sweep(loaded, config, strategies, procs, sweep_dir, windows, window_days,
               None if no_plot else sweep_dir / "sweep.png")
        return
    results = run_strategies(loaded, config, strategies, workers=procs)
    _emit(
        results,
        loaded,
        config,
        style="json" if as_json else "markdown" if markdown else "table",
        plot=None if no_plot else plot,
        summary=summary,
    )


def _sources(trace: Trace, config: SimConfig, strategies: list[str], *,
             reserved_share: float, reserved_price: float, queue_delay: float,
             queue_price: float) -> None:
    from controller.simulate.sources import SourcesConfig, run_sources, sources_markdown

    sources = SourcesConfig(
        cloud=config.cloud, seed=config.seed, reserved_share=reserved_share,
        reserved_price=reserved_price, queue_delay_s=queue_delay, queue_price=queue_price,
        start_timeout_s=config.start_timeout_s, price_per_gpu_hour=config.price_per_gpu_hour,
    )
    try:
        sources.validate()
    except ValueError as exc:
        raise _fail(str(exc)) from None
    typer.echo(sources_markdown(run_sources(trace, sources, strategies)))


def _sweep(
    trace: Trace,
    config: SimConfig,
    strategies: list[str],
    workers: int,
    out_dir: Path,
    windows: int,
    window_days: float,
    png: Path | None,
) -> None:
    from controller.simulate import plots
    from controller.simulate import sweep as sw

    spec = sw.SweepSpec(
        windows=windows,
        window_days=window_days,
        seed=config.seed,
        strategies=tuple(strategies),
        base=config,
    )
    try:
        spec.validate()
    except ValueError as exc:
        raise _fail(str(exc)) from None
    result = sw.run_sweep(trace, spec, workers)
    csv_path = out_dir / "sweep.csv"
    try:
        sw.write_csv(result.rows, csv_path)
        if png is not None:
            plots.sweep(
                result.points,
                [m.name for m in spec.mixes],
                [level.name for level in spec.levels],
                spec.strategies,
                sw.subtitle(trace, spec, result),
                png,
                [level.label for level in spec.levels],
            )
    except OSError as exc:
        raise _fail(f"cannot write under {out_dir}: {exc.strerror or exc}") from None
    typer.echo(sw.markdown(result, spec))
    typer.echo(f"csv: {csv_path}" + (f"\nplot: {png}" if png is not None else ""))
    typer.echo(
        f"sweep: {len(result.rows)} runs ({len(spec.levels)} scarcity levels x "
        f"{len(spec.mixes)} mixes x {spec.windows} window(s) x {len(spec.strategies)} "
        f"strategies) in {result.wall_s:.1f} s wall on {workers} processes, "
        f"{sum(r['wall_s'] for r in result.rows):.1f} s of simulation"
    )


def _emit(
    results: list[StrategyResult],
    trace: Trace,
    config: SimConfig,
    *,
    style: str,
    plot: Path | None,
    summary: bool,
) -> None:
    from rich.console import Console

    from controller.simulate import plots, report

    # With --json, stdout carries only the JSON (and the summary line): the rest goes to stderr.
    console = Console(stderr=style == "json")
    if not console.is_terminal:
        # Piped to a file: keep one row per metric, whatever the number of strategies.
        console.width = max(120, 30 + 16 * len(results))
    if style == "json":
        typer.echo(json.dumps(report.to_json(results, trace, config), indent=2))
    elif style == "markdown":
        typer.echo(report.markdown_table(results))
    else:
        console.print(report.rich_table(results, trace, config))
    if plot is not None:
        try:
            plots.timeline(results, trace, config, plot)
        except OSError as exc:
            raise _fail(f"cannot write the plot {plot}: {exc.strerror or exc}") from None
        console.print(f"plot: {plot}")
    if summary:
        typer.echo(report.summary_line(results))
