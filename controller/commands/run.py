"""``muster run``: the controller against the current kubeconfig (or in-cluster).

Reads the one config (``--config FILE`` plus ``MUSTER_*`` variables; a bad key stops it
here with a message), sets up logging, and runs :class:`controller.reconcilers.operator.
Controller` until SIGINT/SIGTERM. ``/healthz`` (JSON counters) is served on
``server.probe_port`` and ``/metrics`` (the controller's Prometheus registry, plus the
process collectors) on ``server.metrics_port``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from aiohttp import web

    from controller.reconcilers.operator import Controller


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(fmt: str, level: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # kopf logs every event-handler call at INFO; Muster's own logs say what matters.
    logging.getLogger("kopf").setLevel(max(logging.WARNING, root.level))


def run_command(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Muster's YAML config file.")
    ] = None,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="Kubeconfig to use (default: $KUBECONFIG, ~/.kube/config).")
    ] = None,
    context: Annotated[str | None, typer.Option(help="Kubeconfig context.")] = None,
    in_cluster: Annotated[
        bool, typer.Option("--in-cluster", help="Use the pod's service account.")
    ] = False,
) -> None:
    """Run the ProvisioningRequest controller until interrupted."""
    from controller.config import ConfigError, load_config

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    setup_logging(cfg.log_format, cfg.log_level)
    from controller.reconcilers.operator import StartupError

    # Signal handlers stop the controller cleanly; a second Ctrl-C just exits.
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_run(cfg, kubeconfig=kubeconfig, context=context, in_cluster=in_cluster))
    except StartupError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def probe_app(controller: Controller) -> web.Application:
    """``/metrics`` (Prometheus text from the controller's registry) and ``/healthz``."""
    from aiohttp import web

    from controller.metrics import CONTENT_TYPE

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=controller.metrics.exposition(),
                            headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response(controller.health())

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app


async def _run(cfg: Any, *, kubeconfig: Path | None, context: str | None, in_cluster: bool) -> None:
    from aiohttp import web
    from prometheus_client import PlatformCollector, ProcessCollector

    from controller.kube import KubeClient
    from controller.reconcilers.operator import Controller
    from controller.runtime import freeze_heap, tune_gc

    log = logging.getLogger("muster")
    kube = KubeClient.in_cluster() if in_cluster else await KubeClient.from_kubeconfig(
        kubeconfig, context=context
    )
    controller = Controller(kube=kube, config=cfg)
    # Process metrics (CPU, memory, open fds) only here: in tests and the demo several
    # controllers share a process, and each would report the same figures.
    ProcessCollector(registry=controller.metrics.registry)
    PlatformCollector(registry=controller.metrics.registry)
    stop = asyncio.Event()
    runner = web.AppRunner(probe_app(controller), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", cfg.server.metrics_port).start()
    if cfg.server.probe_port != cfg.server.metrics_port:
        await web.TCPSite(runner, "0.0.0.0", cfg.server.probe_port).start()
    loop = asyncio.get_running_loop()

    def take_signals() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)

    take_signals()  # a signal during start-up stops Muster once start-up is done
    tune_gc()
    try:
        await controller.start()
    except BaseException:
        await runner.cleanup()
        await kube.close()
        raise
    freeze_heap()
    # kopf installs its own SIGINT/SIGTERM handlers while it starts, which would stop kopf
    # alone; take them back so a signal stops everything (kopf included).
    take_signals()
    log.info("Muster is running against %s (cluster %s)", kube.host, cfg.cluster_name)
    try:
        waiters: set[asyncio.Future[Any]] = {asyncio.ensure_future(stop.wait())}
        if controller.kopf_task is not None:
            waiters.add(controller.kopf_task)
        _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for fut in pending:
            if fut is not controller.kopf_task:
                fut.cancel()
        if not stop.is_set():
            # kopf ended by itself: it took a signal meant for Muster while starting, or failed.
            log.warning("kopf stopped; stopping Muster")
    finally:
        log.info("stopping")
        await controller.stop()
        await runner.cleanup()
        await kube.close()
