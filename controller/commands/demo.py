"""``muster demo``: the sandbox, the controller, the fake provider and the scheduler in one
process; see :mod:`controller.commands.demo_scenario` for the story it runs.

Heavy imports (kubernetes-asyncio, the sandbox) happen when the command runs, so
``muster --help`` stays fast.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console


def demo_command(
    workers: Annotated[int, typer.Option(min=1, max=64, help="8-GPU workers in the gang.")] = 12,
    timeout: Annotated[
        float, typer.Option(min=1, help="Give up (exit 1) after this many seconds.")
    ] = 45.0,
    latency: Annotated[
        float, typer.Option(min=0, help="Fake provider: seconds one acquisition takes.")
    ] = 0.5,
    ready_delay: Annotated[
        float, typer.Option(min=0, help="Fake provider: seconds a new node takes to be Ready.")
    ] = 1.0,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Also write the sandbox's kubeconfig here (to watch with kubectl)."),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show the controller's logs.")
    ] = False,
    kueue: Annotated[
        bool, typer.Option("--kueue", help="Show path B: the gang as a Kueue Workload admitted "
                           "through Muster's own admission check.")
    ] = False,
) -> None:
    """Run Muster end to end in one process and watch a gang get capacity and run.

    Starts the API sandbox, the controller, the fake provider and the sandbox scheduler,
    submits a gang (workers x 8 GPUs required in one rack, plus a launcher) and exits 0
    once every pod of the gang is bound (1 on failure or timeout).
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aiohttp.access").setLevel(logging.INFO if verbose else logging.ERROR)
    from controller.commands.demo_scenario import DemoFailed, run_demo
    from controller.kube import ApiError

    console = Console()
    started = time.monotonic()
    if kueue:
        _run_kueue(workers, timeout, latency, ready_delay, kubeconfig, console, started)
        return
    try:
        asyncio.run(run_demo(
            workers=workers, time_limit=timeout, latency=latency, ready_delay=ready_delay,
            console=console, kubeconfig_out=kubeconfig,
        ))
    except DemoFailed as exc:
        console.print(f"[red bold]demo failed:[/] {exc}")
        raise typer.Exit(1) from None
    except (ApiError, OSError) as exc:
        console.print(f"[red bold]demo failed:[/] {exc}")
        raise typer.Exit(1) from None
    console.print(f"[green]demo finished in {time.monotonic() - started:.1f}s[/]")


def _run_kueue(
    workers: int, timeout: float, latency: float, ready_delay: float, kubeconfig: Path | None,
    console: Console, started: float,
) -> None:
    from controller.commands.kueue_demo import KueueDemoFailed, run_kueue_demo
    from controller.kube import ApiError

    try:
        asyncio.run(run_kueue_demo(
            workers=workers, time_limit=timeout, latency=latency, ready_delay=ready_delay,
            console=console, kubeconfig_out=kubeconfig,
        ))
    except (KueueDemoFailed, ApiError, OSError) as exc:
        console.print(f"[red bold]demo failed:[/] {exc}")
        raise typer.Exit(1) from None
    console.print(f"[green]demo finished in {time.monotonic() - started:.1f}s[/]")
