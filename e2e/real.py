"""The real-cluster test tier: the control plane of :mod:`e2e.cluster` and Muster running on it
as its own process, under its ServiceAccount's kubeconfig.

Registered as a pytest plugin by the root ``conftest.py``, so ``tests/`` and ``e2e/`` share one
cluster and one Muster per session. A test joins the tier by using :func:`real_cluster` (or a
fixture built on it) and carrying the ``real`` marker; ``pytest -m "not real"`` runs the
sandbox tier alone. The cluster is built on first use (cached) and started once; a cluster
that was already up (``hack/cluster/up.sh``) is reused and left running.

Muster's log is read after every test: a ``Forbidden`` answer from the real RBAC authorizer
means the shipped manifests miss a grant, and fails the test that was running.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.state.object_store import CONSUME_ANNOTATION
from e2e import cluster as cp
from e2e import rbac_audit

ROOT = Path(__file__).resolve().parents[1]
E2E_CONFIG = ROOT / "e2e" / "muster-e2e.yaml"
FORBIDDEN = re.compile(r"forbidden", re.IGNORECASE)
REAL = "real"
CLOUD = "cloud"


class MusterProcess:
    """``muster run`` against the cluster as Muster's ServiceAccount, restartable."""

    def __init__(self, cluster: cp.Cluster, *, config: Path = E2E_CONFIG,
                 extra_env: dict[str, str] | None = None, replica: int = 0,
                 kubeconfig: Path | None = None) -> None:
        """``replica`` > 0: another replica beside the first (its own ports and log), for
        leader failover; ``kubeconfig``: other than the ServiceAccount's own (a proxy)."""
        self.cluster = cluster
        self.kubeconfig = kubeconfig or cluster.muster_kubeconfig
        self.config = config
        self.log = cluster.logs / ("muster.log" if not replica else f"muster-{replica}.log")
        self.probe_port = cluster.ports.base + 20 + 2 * replica
        self.metrics_port = cluster.ports.base + 21 + 2 * replica
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self._read = 0

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
        env.update(
            MUSTER_SERVER__PROBE_PORT=str(self.probe_port),
            MUSTER_SERVER__METRICS_PORT=str(self.metrics_port),
            # kwok is the kubelet of the fake provider's nodes here.
            MUSTER_PROVIDERS__KIND__HEARTBEAT_SECONDS="0",
            # A restarted process takes the Lease its predecessor released on SIGTERM at
            # once; after SIGKILL it waits one lease duration, kept short for tests.
            MUSTER_LEADER_ELECTION__LEASE_DURATION_SECONDS="4",
            MUSTER_LEADER_ELECTION__RENEW_DEADLINE_SECONDS="3",
            MUSTER_LEADER_ELECTION__RETRY_PERIOD_SECONDS="0.5",
            MUSTER_LEADER_ELECTION__NAMESPACE=cp.MUSTER_NAMESPACE,
            # Muster's own admission check (path B) next to real Kueue; the tier installs
            # config/rbac/kueue for it (e2e/test_kueue_real.py).
            MUSTER_KUEUE__ENABLED="true",
        )
        env.update(self.extra_env)
        return env

    def start(self, *, wait: bool = True) -> None:
        if self.running:
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "controller.cli", "run",
                 "--kubeconfig", str(self.kubeconfig),
                 "--config", str(self.config)],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env(), start_new_session=True,
            )
        if wait:
            self.wait_ready()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, within: float = 60.0, *, roles: tuple[str, ...] = ("leader", "single")
                   ) -> None:
        """Until /readyz is 200 in one of ``roles`` (``single``: leader election off)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"muster run exited {self.proc.returncode}:\n{self.tail()}")
            if self.role(ready=True) in roles:
                return
            time.sleep(0.1)
        raise AssertionError(f"muster run never became the ready leader:\n{self.tail()}")

    def role(self, *, ready: bool = False) -> str | None:
        """The replica's role from /healthz (or from /readyz when it answers 200 there,
        with ``ready``); None when it does not answer."""
        url = f"http://127.0.0.1:{self.probe_port}/{'readyz' if ready else 'healthz'}"
        with contextlib.suppress(OSError, ValueError), \
                urllib.request.urlopen(url, timeout=1) as resp:
            if resp.status == 200:
                return str(json.loads(resp.read().decode()).get("role"))
        return None

    def stop(self, sig: int = signal.SIGTERM, within: float = 30.0) -> int | None:
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(within)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return proc.returncode

    def restart(self) -> None:
        self.stop()
        self.start()

    def exited(self) -> int | None:
        """The exit code when the process ended on its own (a crash, or a lost Lease, on
        which Muster exits), not by :meth:`stop`; else None."""
        return self.proc.poll() if self.proc is not None else None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def new_lines(self) -> list[str]:
        """Log lines written since the last call."""
        try:
            with self.log.open("rb") as f:
                f.seek(self._read)
                data = f.read()
        except OSError:
            return []
        self._read += len(data)
        return data.decode(errors="replace").splitlines()


def forbidden(lines: list[str]) -> list[str]:
    return [line for line in lines if FORBIDDEN.search(line)]


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest) -> Iterator[cp.Cluster]:
    """The local control plane, started once per session (built first if needed), in a state
    directory and on ports no other test run on the machine uses."""
    try:
        cluster = cp.session_cluster()
    except cp.ClusterError as exc:
        pytest.fail(f"no cluster for this run: {exc}", pytrace=False)
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def terminal() -> Any:
        """Progress goes to the terminal, not to the captured output (a new context each
        time: pytest's is single-use)."""
        return capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()

    if _BUILD_ERROR:
        pytest.fail(f"the real control plane could not be built: {_BUILD_ERROR[0]}",
                    pytrace=False)
    with terminal():
        was_up = cp.running(cluster)
        try:
            cp.up(cluster)
        except cp.ClusterError as exc:
            pytest.fail(f"the real control plane did not start: {exc}", pytrace=False)
    yield cluster
    if not was_up and not os.environ.get("MUSTER_KEEP_CLUSTER"):
        with terminal():
            cp.down(cluster)


@pytest.fixture(scope="session")
def real_muster(real_cluster: cp.Cluster) -> Iterator[MusterProcess]:
    """Muster as its own process, as its ServiceAccount, for the whole session."""
    muster = MusterProcess(real_cluster)
    SESSION_MUSTERS.append(muster)  # the cloud tier stops it while its own Muster runs
    muster.new_lines()  # earlier sessions' lines are not this session's business
    audit = real_cluster.audit_log
    since = audit.stat().st_size if audit.exists() else 0
    muster.start()
    yield muster
    code = muster.stop()
    refused = forbidden(muster.new_lines())
    usage = rbac_audit.read(audit, since=since, restarts=cp.restarted_at(real_cluster),
                            grace=cp.RESTART_GRACE_SECONDS)
    if audit.exists():  # a cluster this harness started (not one given by --kubeconfig)
        _RBAC_REPORT[:] = rbac_audit.report(usage, rbac_audit.granted())
    assert code == 0, f"muster run exited {code} on SIGTERM:\n{muster.tail()}"
    assert not refused, "Muster was refused by RBAC:\n" + "\n".join(refused[:10])
    assert not usage.refused, "the API server refused Muster (audit log):\n" + "\n".join(
        _RBAC_REPORT)


_RBAC_REPORT: list[str] = []
SESSION_MUSTERS: list[MusterProcess] = []
"""The session's Muster (one per cluster is the leader; e2e/cloud/tier.py runs its own)."""


@pytest.fixture
def muster_rbac_clean(real_muster: MusterProcess) -> Iterator[MusterProcess]:
    """Fails the test if Muster met a Forbidden while it ran."""
    real_muster.new_lines()
    yield real_muster
    refused = forbidden(real_muster.new_lines())
    assert not refused, "Muster was refused by RBAC:\n" + "\n".join(refused[:10])


# --------------------------------------------------------------------------- failure context

_FAILURE_CONTEXT = pytest.StashKey[tuple[MusterProcess, str, dict[str, int]]]()
_CONTEXT_LOGS = ("muster.log", "kueue.log", "kube-scheduler.log")
_CONTEXT_LINES = 60


def record_failure_context(item: pytest.Item, muster: MusterProcess, namespace: str) -> None:
    """Remember where the components' logs stood when a real-tier test began, so a failure
    report can show what Muster, Kueue and the scheduler said about its namespace meanwhile
    (CI keeps no logs: the report is all a failed run leaves behind)."""
    offsets = {}
    for name in _CONTEXT_LOGS:
        with contextlib.suppress(OSError):
            offsets[name] = (muster.cluster.logs / name).stat().st_size
    item.stash[_FAILURE_CONTEXT] = (muster, namespace, offsets)


def note_unexpected_exit(item: pytest.Item, muster: MusterProcess) -> None:
    """At a real-tier test's end: if the session's Muster ended on its own meanwhile, say so
    in the session summary (the env fixture starts it again for the next test)."""
    code = muster.exited()
    if code is not None:
        last = muster.tail(1).strip()
        _EXITS.append(f"  during {item.nodeid}: exit code {code}; its last line: {last}")


_EXITS: list[str] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    context = item.stash.get(_FAILURE_CONTEXT, None)
    if report.when == "call" and report.failed and context is not None:
        report.sections.extend(failure_context(*context))
    return report


def failure_context(muster: MusterProcess, namespace: str, offsets: dict[str, int]
                    ) -> list[tuple[str, str]]:
    """Whether Muster's process ended on its own, the test namespace's ProvisioningRequests
    and pods as the API server has them now, and each component's log lines about that
    namespace (Muster's warnings too) since the test began."""
    cluster = muster.cluster
    sections = []
    code = muster.exited()
    if code is not None:
        sections.append((f"muster run exited on its own (code {code})", muster.tail(15)))
    sections.append((f"{namespace} now", _namespace_objects(cluster, namespace)))
    for name, start in offsets.items():
        try:
            with (cluster.logs / name).open("rb") as f:
                f.seek(start)
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            continue
        wanted = [line for line in lines if namespace in line
                  or (name == "muster.log" and (" WARNING " in line or " ERROR " in line))]
        if wanted:
            sections.append((f"{name} about {namespace} (last {_CONTEXT_LINES} lines)",
                             "\n".join(wanted[-_CONTEXT_LINES:])))
    return sections


def _namespace_objects(cluster: cp.Cluster, namespace: str) -> str:
    try:
        done = cp.kubectl(cluster, "get", "provisioningrequests.autoscaling.x-k8s.io,pods",
                          "-n", namespace, "-o", "json", check=False)
        items = json.loads(done.stdout or "{}").get("items") or []
    except (cp.ClusterError, ValueError) as exc:
        return f"(could not list: {exc})"
    out = []
    for obj in items:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        annotations = meta.get("annotations") or {}
        if obj.get("kind") == "Pod":
            consumes = annotations.get(CONSUME_ANNOTATION)
            out.append(f"pod {meta.get('name')}: node={obj['spec'].get('nodeName')} "
                       f"phase={status.get('phase')} consumes={consumes}")
        else:
            conditions = " ".join(
                f"{c.get('type')}={c.get('status')}/{c.get('reason')}@"
                f"{c.get('lastTransitionTime')}" for c in status.get("conditions") or [])
            out.append(f"provisioningrequest {meta.get('name')}: "
                       f"phase={annotations.get('muster.dev/phase')} {conditions}")
    return "\n".join(out) or "(nothing)"


# --------------------------------------------------------------------------- tier summary


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{REAL}: runs against the real control plane (kube-apiserver, scheduler, "
        "kwok, Kueue built by hack/cluster/build.sh)")


_BUILD_ERROR: list[str] = []
_BUILT: list[bool] = []
_CLOUD_IDS: set[str] = set()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every real-tier test after every sandbox test (a stable sort: each tier keeps its
    order), so a cold build of the control plane (many minutes) runs beside the sandbox tier
    (``hack/test`` starts it in the background) and the cluster starts only when needed. Last,
    so that ``-m "not real"`` and ``-k`` have already deselected: a sandbox run builds nothing."""
    # By marker, not keyword: a directory named cloud (tests/cloud) is a keyword too.
    _CLOUD_IDS.update(item.nodeid for item in items if item.get_closest_marker(CLOUD))
    items.sort(key=lambda item: REAL in item.keywords)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, None, None]:
    """Before the first real-tier test, wait for (or do) the control plane's build, outside
    any test's timeout: outermost, so pytest-timeout's clock starts after it."""
    if not _BUILT and REAL in item.keywords:
        _BUILT.append(True)
        _build(item.config)
    yield


def _build(config: pytest.Config) -> None:
    with contextlib.suppress(ValueError):
        if config.getoption("--kubeconfig"):
            return
    capture = config.pluginmanager.getplugin("capturemanager")
    ctx = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    with ctx:
        try:
            cp.build()
        except cp.ClusterError as exc:
            _BUILD_ERROR.append(str(exc))


def _tier(report: Any) -> str:
    if report.nodeid in _CLOUD_IDS:
        return CLOUD
    return REAL if REAL in report.keywords else "sandbox"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    counts: dict[str, Counter[str]] = {"sandbox": Counter(), REAL: Counter(),
                                       CLOUD: Counter()}
    for outcome in ("passed", "failed", "skipped", "error", "xfailed", "xpassed"):
        for report in terminalreporter.stats.get(outcome, []):
            if not hasattr(report, "keywords"):
                continue
            when = getattr(report, "when", "call")
            if outcome == "passed" and when != "call":
                continue
            key = "failed" if outcome in ("error", "xpassed") else outcome
            key = "skipped" if key == "xfailed" else key
            counts[_tier(report)][key] += 1
    for line in _RBAC_REPORT:
        terminalreporter.write_line(line)
    if _EXITS:
        terminalreporter.write_line(
            f"muster (real): the session's Muster ended on its own {len(_EXITS)} time(s):")
        for line in _EXITS:
            terminalreporter.write_line(line)
    version = cp.kubernetes_version()
    for tier, label in (("sandbox", "tier sandbox"),
                        (REAL, f"tier real (kube-apiserver {version})"),
                        (CLOUD, f"tier cloud (EC2: moto {_moto_version()} behind "
                                "e2e/cloud/ec2.py; Compute: tests/providers/gcp_fake.py; "
                                f"kube-apiserver {version})")):
        c = counts[tier]
        terminalreporter.write_line(
            f"{label}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")


def _moto_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("moto")
    except PackageNotFoundError:
        return "not installed"
