"""``muster run``: the controller against the current kubeconfig (or in-cluster).

Reads the one config (``--config FILE`` plus ``MUSTER_*`` variables; a bad key stops it
here with a message), sets up logging, and runs :class:`controller.operator.
Controller` until SIGINT/SIGTERM. With ``leader_election.enabled`` (the default) it first
campaigns for a Lease (:mod:`controller.runtime.leader`) and starts the controller only once it
leads; losing the Lease stops all reconciling at once and exits 1, so the pod restarts and
campaigns again (never two leaders acting). A clean stop releases the Lease for a fast
hand-over. ``/healthz`` (liveness) and ``/readyz`` (readiness, see
:mod:`controller.commands.probes`) are served on ``server.probe_port``, ``/metrics`` (the
controller's Prometheus registry, plus the process collectors) on ``server.metrics_port``:
HTTPS for authenticated, authorized scrapers only unless ``server.metrics_secure`` is off
(:mod:`controller.commands.metrics_auth`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controller.common.decision_log import FIELDS_ATTR

if TYPE_CHECKING:  # imported lazily at run time: `muster --help` stays fast
    from aiohttp import web

    from controller.commands.probes import Probes
    from controller.kube import KubeClient
    from controller.operator import Controller
    from controller.runtime.leader import LeaderElector

log = logging.getLogger("muster")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, FIELDS_ATTR, None)
        if isinstance(fields, dict):  # a decision (controller/common/decision_log.py): its own keys
            out.update({k: v for k, v in fields.items() if k not in out})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(fmt: str, level: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


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
    problem = _kubeconfig_problem(kubeconfig, in_cluster)
    if problem:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    setup_logging(cfg.log_format, cfg.log_level)
    from controller.operator import StartupError
    from controller.runtime.leader import LeadershipLost

    # Signal handlers stop the controller cleanly; a second Ctrl-C just exits.
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_run(cfg, kubeconfig=kubeconfig, context=context, in_cluster=in_cluster))
    except UsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except (StartupError, LeadershipLost) as exc:
        # Non-zero either way: the kubelet restarts the container, which campaigns afresh.
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _kubeconfig_problem(kubeconfig: Path | None, in_cluster: bool) -> str | None:
    """Why no kubeconfig file can be read, before the client library logs and raises."""
    if in_cluster:
        return None
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            what = "not a file" if kubeconfig.exists() else "no such file"
            return f"--kubeconfig {kubeconfig}: {what}"
        return None
    env = os.environ.get("KUBECONFIG", "")
    paths = [Path(p).expanduser() for p in env.split(os.pathsep) if p] or [
        Path("~/.kube/config").expanduser()]
    if not any(p.is_file() for p in paths):
        where = f"$KUBECONFIG ({env})" if env else "~/.kube/config"
        return (f"no kubeconfig: {where} does not exist; pass --kubeconfig, or --in-cluster "
                "in a pod")
    return None


class UsageError(Exception):
    """A mistake in how Muster was started (kubeconfig, context, --in-cluster, a port in use):
    one line and exit 2, not a traceback."""


async def connect(kubeconfig: Path | None, context: str | None, in_cluster: bool) -> KubeClient:
    """A client from the pod's service account or a kubeconfig; :class:`UsageError` names
    what is wrong with them."""
    from kubernetes_asyncio.config import ConfigException

    from controller.kube import KubeClient

    if in_cluster:
        try:
            return KubeClient.in_cluster()
        except ConfigException as exc:
            raise UsageError(
                f"--in-cluster: not running in a Kubernetes pod ({exc}); use --kubeconfig "
                "outside a cluster") from None
    where = (f"--kubeconfig {kubeconfig}" if kubeconfig
             else "the default kubeconfig ($KUBECONFIG or ~/.kube/config)")
    try:
        return await KubeClient.from_kubeconfig(kubeconfig, context=context)
    except ConfigException as exc:
        text = " ".join(str(exc).split())
        if context and "context" in text.lower():
            raise UsageError(f"--context {context}: not in {where} ({text})") from None
        raise UsageError(f"{where}: {text}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not a text file (not UTF-8)") from None
    except OSError as exc:
        raise UsageError(f"{where}: {exc.strerror or exc}") from None
    except Exception as exc:
        # A file that parses as YAML but is no kubeconfig fails deep in the loader with
        # whatever it tripped on (TypeError, AttributeError, yaml errors ...).
        raise UsageError(f"{where}: not a usable kubeconfig ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())})") from None


LOST_STOP_SECONDS = 5.0
"""After losing the Lease, how long the controller may take to tear down before the process
exits anyway (it already stopped acting: :meth:`Controller.halt` ran at the moment of loss)."""


async def _run(cfg: Any, *, kubeconfig: Path | None, context: str | None, in_cluster: bool) -> None:
    from prometheus_client import PlatformCollector, ProcessCollector

    from controller.commands.probes import Probes
    from controller.operator import Controller
    from controller.runtime.leader import LeadershipLost, from_config

    kube = await connect(kubeconfig, context, in_cluster)
    controller = Controller(kube=kube, config=cfg)
    # Process metrics (CPU, memory, open fds) only here: in tests and the demo several
    # controllers share a process, and each would report the same figures.
    ProcessCollector(registry=controller.metrics.registry)
    PlatformCollector(registry=controller.metrics.registry)
    # The Lease gets a client (connection pool) of its own, as controller-runtime does: the
    # controller's hundreds of concurrent requests, long watches and shutdown must never
    # delay a renewal or the release.
    lease_kube = (await connect(kubeconfig, context, in_cluster)
                  if cfg.leader_election.enabled else None)
    elector = from_config(lease_kube, cfg.leader_election) if lease_kube is not None else None
    probes = Probes(controller, elector)
    lost = elector.lost if elector is not None else asyncio.Event()
    if elector is not None:

        def stop_acting() -> None:
            probes.stopping = True
            controller.halt()

        elector.on_lost(stop_acting)

    # /tmp (the pod's emptyDir): the self-signed certificate of /metrics, if one is made.
    scratch = Path(tempfile.mkdtemp(prefix="muster-run-"))
    try:
        runners = await _serve_endpoints(cfg, probes, kube, scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        await kube.close()
        if lease_kube is not None:
            await lease_kube.close()
        raise
    stop = asyncio.Event()
    try:
        await _serve(cfg, controller, elector, stop, lost)
    finally:
        probes.stopping = True
        log.info("stopping")
        if lost.is_set():
            # Not ours any more: no release, and a bounded teardown (controller-runtime
            # exits at once; the successor may take over lease_duration after our last
            # renewal).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LOST_STOP_SECONDS):
                    await controller.stop()
        else:
            await controller.stop()
            if elector is not None:
                await elector.release()
        for runner in runners:
            await runner.cleanup()
        shutil.rmtree(scratch, ignore_errors=True)
        await kube.close()
        if lease_kube is not None:
            await lease_kube.close()
    if elector is not None and lost.is_set():
        raise LeadershipLost(
            f"lost the lease {elector.key}; exiting so the pod restarts and campaigns again"
        )


async def _serve_endpoints(
    cfg: Any, probes: Probes, kube: KubeClient, scratch: Path,
) -> list[web.AppRunner]:
    """The probes on plain HTTP (the kubelet's), /metrics on HTTPS behind authentication and
    authorization when ``server.metrics_secure`` (else plain HTTP, sharing the probes' port
    when both are the same)."""
    from aiohttp import web

    from controller.commands.metrics_auth import MetricsAuth, server_tls

    server = cfg.server
    metrics = (server.metrics_address, server.metrics_port, "server.metrics")
    probe = (server.probe_address, server.probe_port, "server.probe")
    apps: list[tuple[web.Application, tuple[str, int, str], Any]] = []
    if server.metrics_secure:
        cert_dir = Path(server.metrics_cert_dir) if server.metrics_cert_dir else None
        tls = server_tls(cert_dir, scratch / "metrics-tls")
        apps.append((probes.app(probes=False, auth=MetricsAuth(kube)), metrics, tls))
        apps.append((probes.app(metrics=False), probe, None))
    elif server.shared_port:
        apps.append((probes.app(), probe, None))
    else:
        apps.append((probes.app(probes=False), metrics, None))
        apps.append((probes.app(metrics=False), probe, None))
    runners = []
    try:
        for app, (address, port, key), tls in apps:
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            runners.append(runner)
            try:
                await web.TCPSite(runner, address, port, ssl_context=tls).start()
            except OSError as exc:
                why = os.strerror(exc.errno).lower() if exc.errno else str(exc)
                raise UsageError(
                    f"{key}_address {address} {key}_port {port}: cannot listen there "
                    f"({why})") from None
    except BaseException:
        for runner in runners:
            await runner.cleanup()
        raise
    return runners


async def _serve(
    cfg: Any, controller: Controller, elector: LeaderElector | None, stop: asyncio.Event,
    lost: asyncio.Event,
) -> None:
    """Campaign (if enabled), start the controller once leading, run until a signal or the
    loss of the Lease."""
    from controller.runtime.memory import freeze_heap, trim_heap_every, tune_gc

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # also while standing by or starting
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if elector is not None:
        log.info("campaigning for lease %s as %s", elector.key, elector.identity)
        if not await _unless(elector.acquire(), stop):
            return
    tune_gc()
    if not await _unless(controller.start(), stop, lost):
        return
    freeze_heap()
    log.info("Muster is running against %s (cluster %s)", controller.kube.host, cfg.cluster_name)
    trimmer = asyncio.ensure_future(trim_heap_every())
    waiters: set[asyncio.Future[Any]] = {
        asyncio.ensure_future(stop.wait()), asyncio.ensure_future(lost.wait())
    }
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        trimmer.cancel()
        for fut in waiters:
            fut.cancel()


async def _unless(work: Awaitable[None], *events: asyncio.Event) -> bool:
    """Run ``work`` to its end (True; its exception propagates) unless one of ``events`` is
    set first (False; ``work`` is cancelled)."""
    task = asyncio.ensure_future(work)
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait([task, *waits], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled ourselves: take the work down with us
        task.cancel()
        raise
    finally:
        for fut in waits:
            fut.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False
