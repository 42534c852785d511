"""A real Kubernetes control plane on 127.0.0.1, for Muster's real-cluster test tier.

``python3 -m e2e.cluster up|down|status|env`` (wrapped by ``hack/cluster/up.sh`` and
``down.sh``) runs, as plain processes, the binaries ``hack/cluster/build.sh`` builds from Go
modules: etcd, kube-apiserver (RBAC, default admission, DRA and the workload-aware scheduling
API on), kube-controller-manager, kube-scheduler (default plugins plus gang scheduling), kwok
(the fake kubelet of every Node that Muster's fake provider creates) and the Kueue manager with
its webhooks registered at ``https://127.0.0.1:<port>``. ``up`` then installs the
ProvisioningRequest, Muster and Kueue CRDs and Muster's RBAC from ``config/rbac``, and writes
two kubeconfigs: an admin one and one for Muster's ServiceAccount (a TokenRequest token), so
the real RBAC authorizer checks the shipped manifests.

Everything lives in one state directory (``.cluster/`` in the clone by default, git-ignored):
certificates (kept between runs), logs, pid files, kubeconfigs, etcd data. ``up`` is
idempotent (a running cluster is reused), ``down`` stops every process it started and checks
that none is left. No traffic leaves 127.0.0.1, and nothing is written outside the state
directory but the claim of its ports (below) and the build cache.

Two clusters on one machine never share ports: unless ``MUSTER_CLUSTER_PORT_BASE`` says
otherwise, a state directory claims a slot of :data:`PORT_SLOT` ports (from
:data:`PORT_BASE_FIRST` up, free and claimed by no other state directory) in a registry under
the user's cache directory, and keeps it (``<state>/port-base``). A test run takes its state
directory for itself (:func:`session_cluster`): a second run beside it, in the same clone,
gets ``.cluster-2`` and ports of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
HACK = ROOT / "hack" / "cluster"
DEFAULT_STATE = ROOT / ".cluster"

# Gates for the release pinned in hack/cluster/versions.env (1.37): DRA is GA; the Workload /
# PodGroup API (scheduling.k8s.io/v1beta1) and the gang scheduling plugin sit behind
# GenericWorkload (beta, off by default), topology-aware workload scheduling behind its alpha gate.
FEATURE_GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"
SERVICE_CIDR = "10.96.0.0/16"  # never routed: no Service traffic exists on these machines
BOOT_DELAY_ANNOTATION = "muster.dev/boot-delay"  # providers/fake.py sets it
MUSTER_NAMESPACE = "muster-system"
HARNESS_VARIABLES = ("MUSTER_CLUSTER_STATE", "MUSTER_CLUSTER_PORT_BASE", "MUSTER_KEEP_CLUSTER",
                     "MUSTER_CLUSTER_INSTALL")
"""This harness's environment variables: they share Muster's ``MUSTER_`` prefix but are no
Muster settings (``load_config`` refuses unknown ``MUSTER_*`` variables)."""
MUSTER_SA = "muster"
# The webhooks Kueue serves for what this cluster runs (its own objects and batch/v1 Jobs);
# the manifests also list webhooks of frameworks that are not installed here.
KUEUE_WEBHOOK_PATHS = ("kueue-x-k8s-io", "batch-v1-job")
COMPONENTS = (
    "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kueue",
)


class ClusterError(RuntimeError):
    """The control plane could not be built, started or reached; the message says which part."""


@dataclass(frozen=True)
class Ports:
    base: int

    @property
    def etcd(self) -> int:
        return self.base

    @property
    def etcd_peer(self) -> int:
        return self.base + 1

    @property
    def apiserver(self) -> int:
        return self.base + 2

    @property
    def controller_manager(self) -> int:
        return self.base + 3

    @property
    def scheduler(self) -> int:
        return self.base + 4

    @property
    def kwok(self) -> int:
        return self.base + 5

    @property
    def kueue_webhook(self) -> int:
        return self.base + 6

    @property
    def kueue_health(self) -> int:
        return self.base + 7

    @property
    def kueue_metrics(self) -> int:
        return self.base + 8


@dataclass(frozen=True)
class Cluster:
    """A control plane's state directory and what tests need from it."""

    state: Path
    ports: Ports

    @property
    def admin_kubeconfig(self) -> Path:
        return self.state / "admin.kubeconfig"

    @property
    def muster_kubeconfig(self) -> Path:
        return self.state / "muster.kubeconfig"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def pid_file(self, component: str) -> Path:
        return self.state / "run" / f"{component}.pid"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    def version(self) -> str:
        return kubernetes_version()


def kubernetes_version() -> str:
    """The Kubernetes release hack/cluster/versions.env pins."""
    return _versions()["KUBERNETES_VERSION"]


def default_cluster() -> Cluster:
    """``MUSTER_CLUSTER_STATE`` (default ``.cluster`` in the clone) with
    ``MUSTER_CLUSTER_PORT_BASE``, or else the ports that state directory claimed."""
    state = Path(os.path.abspath(os.environ.get("MUSTER_CLUSTER_STATE", DEFAULT_STATE)))
    given = os.environ.get("MUSTER_CLUSTER_PORT_BASE")
    if given is not None:
        try:
            base = int(given)
        except ValueError:
            raise ClusterError(
                f"MUSTER_CLUSTER_PORT_BASE must be a port number, got {given!r}") from None
    else:
        base = port_base(state)
    return Cluster(state=state, ports=Ports(base))


PORT_BASE_FIRST = 26400
PORT_SLOT = 50
"""Ports a cluster uses from its base: its components (+0 to +8), Muster's processes (+20 to
+25, e2e/real.py), a fault proxy (+24) and a bare cluster beside it (+40 to +48)."""
PORT_SLOTS = 60
LEGACY_PORT_BASE = 26400
"""Every cluster's base before bases were claimed: a running cluster without a recorded base
was started with it."""


def _port_registry() -> Path:
    cache = os.environ.get("MUSTER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "muster")
    return Path(cache) / "cluster-ports"


def _recorded_base(state: Path) -> int | None:
    try:
        return int((state / "port-base").read_text().strip())
    except (OSError, ValueError):
        return None


def _claimant(registry: Path, base: int) -> Path | None:
    """The state directory that holds ``base``; None when unclaimed, or when the claimant no
    longer records that base (it moved, or it was deleted with its clone)."""
    try:
        state = Path((registry / str(base)).read_text().strip())
    except OSError:
        return None
    return state if _recorded_base(state) == base else None


def _ports_free(base: int) -> bool:
    for port in range(base, base + PORT_SLOT):
        with socket.socket() as sock:
            # As the components bind: a port left in TIME_WAIT by a stopped cluster is free.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _state_running(state: Path) -> bool:
    for pid_file in (state / "run").glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            if _alive(int(pid_file.read_text().strip())):
                return True
    return False


def port_base(state: Path) -> int:
    """The base of the ports ``state``'s cluster uses: the one it claimed before, while no
    other state directory holds it and its ports are free (or its own cluster runs on them);
    else the first slot that is unclaimed and free. Claims are made under a lock, so two runs
    starting at once get different slots."""
    registry = _port_registry()
    registry.mkdir(parents=True, exist_ok=True)
    with (registry / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        running = _state_running(state)
        recorded = _recorded_base(state)
        if recorded is None and running:
            recorded = LEGACY_PORT_BASE
        if recorded is not None and _claimant(registry, recorded) in (None, state) and (
                running or _ports_free(recorded)):
            chosen = recorded
        else:
            slots = (PORT_BASE_FIRST + i * PORT_SLOT for i in range(PORT_SLOTS))
            free = (b for b in slots if _claimant(registry, b) in (None, state)
                    and _ports_free(b))
            found = next(free, None)
            if found is None:
                raise ClusterError(
                    f"no free port slot for a cluster between {PORT_BASE_FIRST} and "
                    f"{PORT_BASE_FIRST + PORT_SLOTS * PORT_SLOT} (claims in {registry}); "
                    "set MUSTER_CLUSTER_PORT_BASE")
            chosen = found
        state.mkdir(parents=True, exist_ok=True)
        (state / "port-base").write_text(f"{chosen}\n")
        (registry / str(chosen)).write_text(f"{state}\n")
    return chosen


_SESSION: list[tuple[Cluster, IO[str]]] = []


def session_cluster() -> Cluster:
    """This test run's cluster, which no other run on the machine uses: the state directory
    of ``MUSTER_CLUSTER_STATE``, or else the first of ``.cluster``, ``.cluster-2``, ... that
    no other live run holds, locked while this process lives. The choice is exported, so
    every later :func:`default_cluster` (and any tool run from the tests) agrees."""
    if _SESSION:
        return _SESSION[0][0]
    given = os.environ.get("MUSTER_CLUSTER_STATE")
    candidates = [Path(given)] if given else (
        DEFAULT_STATE if i == 1 else ROOT / f"{DEFAULT_STATE.name}-{i}"
        for i in itertools.count(1))
    for state in candidates:
        state.mkdir(parents=True, exist_ok=True)
        lock = (state / "session.lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            if given:
                raise ClusterError(
                    f"another test run is using the cluster in {state} (MUSTER_CLUSTER_STATE); "
                    "unset it to get a cluster of this run's own") from None
            continue
        os.environ["MUSTER_CLUSTER_STATE"] = str(state)
        cluster = default_cluster()
        os.environ["MUSTER_CLUSTER_PORT_BASE"] = str(cluster.ports.base)
        _SESSION.append((cluster, lock))
        return cluster
    raise AssertionError("unreachable: the candidates never end")


def progress(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


def _versions() -> dict[str, str]:
    out = {}
    for line in (HACK / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
    return out


# --------------------------------------------------------------------------- build


def build() -> Path:
    """The bin directory, building what is missing (cached by hack/cluster/build.sh)."""
    done = subprocess.run(
        [str(HACK / "build.sh"), "--print"], capture_output=True, text=True, check=False
    )
    if done.returncode == 0:
        return Path(done.stdout.strip())
    progress("building the control plane from Go modules (first use; cached afterwards)")
    proc = subprocess.run(
        [str(HACK / "build.sh")], stdout=subprocess.PIPE, text=True, check=False
    )  # stderr (progress) goes to the terminal
    if proc.returncode != 0:
        raise ClusterError(f"hack/cluster/build.sh failed with exit {proc.returncode}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _cache_dir(bin_dir: Path) -> Path:
    return bin_dir.parent


# --------------------------------------------------------------------------- certificates


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def _cert(pki: Path, name: str, subject: str, *, sans: str | None = None,
          client: bool = False) -> None:
    if (pki / f"{name}.crt").exists():
        return
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=pki)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr",
             cwd=pki)
    ext = ["basicConstraints=CA:FALSE",
           "keyUsage=critical,digitalSignature,keyEncipherment",
           f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}"]
    if sans:
        ext.append(f"subjectAltName={sans}")
    (pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", f"{name}.ext",
             "-out", f"{name}.crt", cwd=pki)


def certificates(cluster: Cluster) -> Path:
    """A CA, the apiserver's and Kueue's serving certs, the admin client cert, the
    service-account key pair. Kept between runs: they only depend on 127.0.0.1."""
    pki = cluster.state / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                 "-out", "ca.crt", "-days", "3650", "-subj", "/CN=muster-test-ca", cwd=pki)
    _cert(pki, "apiserver", "/CN=kube-apiserver",
          sans="IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
               "DNS:kubernetes.default.svc,IP:10.96.0.1")
    _cert(pki, "kueue-webhook", "/CN=kueue-webhook", sans="IP:127.0.0.1,DNS:localhost")
    _cert(pki, "admin", "/O=system:masters/CN=muster-test-admin", client=True)
    if not (pki / "sa.key").exists():
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    return pki


def _kubeconfig(cluster: Cluster, path: Path, user: dict[str, Any]) -> None:
    pki = cluster.state / "pki"
    body = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "muster-test", "cluster": {
            "server": cluster.server, "certificate-authority": str(pki / "ca.crt")}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "muster-test",
                      "context": {"cluster": "muster-test", "user": "user"}}],
        "current-context": "muster-test",
    }
    path.write_text(yaml.safe_dump(body))
    path.chmod(0o600)


# --------------------------------------------------------------------------- processes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is gone for our purposes.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            return False
    return True


def _pid(cluster: Cluster, component: str) -> int | None:
    path = cluster.pid_file(component)
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _start(cluster: Cluster, component: str, argv: list[str],
           env: dict[str, str] | None = None) -> None:
    if _pid(cluster, component) is not None:
        return
    cluster.logs.mkdir(parents=True, exist_ok=True)
    cluster.pid_file(component).parent.mkdir(parents=True, exist_ok=True)
    with cluster.log(component).open("ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, **(env or {})},
        )
    cluster.pid_file(component).write_text(str(proc.pid))


def _stop(cluster: Cluster, component: str, *, timeout: float = 10.0) -> None:
    pid = _pid(cluster, component)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while _alive(pid):
                if time.monotonic() > deadline:
                    raise ClusterError(f"{component} (pid {pid}) still alive 30s after SIGKILL")
                time.sleep(0.05)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    cluster.pid_file(component).unlink(missing_ok=True)


def _log_tail(cluster: Cluster, component: str, lines: int = 15) -> str:
    try:
        text = cluster.log(component).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


# --------------------------------------------------------------------------- HTTP


def _ssl_context(cluster: Cluster, *, client: bool) -> ssl.SSLContext:
    pki = cluster.state / "pki"
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if client:
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0


def _wait(cluster: Cluster, component: str, probe: Any, *, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        if probe():
            return
        if _pid(cluster, component) is None:
            raise ClusterError(f"{component} exited; last log lines:\n"
                               f"{_log_tail(cluster, component)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{component} not ready after {within:g}s; last log lines:\n"
                               f"{_log_tail(cluster, component)}")
        time.sleep(0.1)


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which("kubectl") is None:
        raise ClusterError("kubectl is needed (Debian package 'kubectl'; hack/test installs it)")
    done = subprocess.run(
        # Its discovery and HTTP caches in the state directory, not ~/.kube/cache.
        ["kubectl", "--kubeconfig", str(cluster.admin_kubeconfig),
         f"--cache-dir={cluster.state / 'kube-cache'}", *args],
        input=stdin, capture_output=True, text=True, check=False,
    )
    if check and done.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done


# --------------------------------------------------------------------------- components


def _start_etcd(cluster: Cluster, bin_dir: Path) -> None:
    p = cluster.ports
    data = cluster.state / "etcd"
    _start(cluster, "etcd", [
        str(bin_dir / "etcd"), "--name", "muster-test", "--data-dir", str(data),
        "--listen-client-urls", f"http://127.0.0.1:{p.etcd}",
        "--advertise-client-urls", f"http://127.0.0.1:{p.etcd}",
        "--listen-peer-urls", f"http://127.0.0.1:{p.etcd_peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{p.etcd_peer}",
        "--initial-cluster", f"muster-test=http://127.0.0.1:{p.etcd_peer}",
        "--listen-metrics-urls", "",
        # Test data: durability across a power cut buys nothing and fsync costs seconds.
        "--unsafe-no-fsync", "--quota-backend-bytes", str(4 << 30),
        "--log-level", "warn",
    ])
    _wait(cluster, "etcd", lambda: _get(f"http://127.0.0.1:{p.etcd}/health") == 200,
          within=30)


def _apiserver_argv(cluster: Cluster, bin_dir: Path) -> list[str]:
    pki = cluster.state / "pki"
    p = cluster.ports
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{p.etcd}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
        f"--secure-port={p.apiserver}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        # No aggregated API server calls back, but the controller-manager and scheduler
        # read this CA from kube-system and log errors every second without one.
        f"--requestheader-client-ca-file={pki / 'ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc",
        "--service-account-max-token-expiration=48h",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--endpoint-reconciler-type=none",
        f"--feature-gates={FEATURE_GATES}",
        f"--runtime-config={RUNTIME_CONFIG}",
        "--allow-privileged=true",
        "--profiling=false",
        # Every request of a ServiceAccount in muster-system, at Metadata level: which rights
        # Muster actually used on this cluster (e2e/rbac_audit.py).
        f"--audit-policy-file={_audit_policy(cluster)}",
        f"--audit-log-path={cluster.audit_log}",
        "--audit-log-format=json", "--audit-log-maxsize=200", "--audit-log-maxbackup=1",
        "--v=1",
    ]


def _audit_policy(cluster: Cluster) -> Path:
    path = cluster.state / "audit-policy.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "Metadata", "userGroups": [f"system:serviceaccounts:{MUSTER_NAMESPACE}"]},
            {"level": "None"},
        ],
    }))
    return path


def start_apiserver(cluster: Cluster, bin_dir: Path) -> None:
    _start(cluster, "kube-apiserver", _apiserver_argv(cluster, bin_dir))
    ctx = _ssl_context(cluster, client=True)
    _wait(cluster, "kube-apiserver",
          lambda: _get(f"{cluster.server}/readyz", ctx) == 200, within=60)


RESTART_GRACE_SECONDS = 90.0
"""After kube-apiserver restarts (etcd kept), its authorizer answers 403 until its RBAC
informers have synced, which can take tens of seconds on a loaded machine, although
/readyz is already 200: refusals in this window are no missing grant."""


def restarted_at(cluster: Cluster) -> list[float]:
    """When :func:`stop_apiserver` stopped a running API server (epoch seconds)."""
    try:
        return [float(x) for x in (cluster.state / "apiserver-restarts").read_text().split()]
    except (OSError, ValueError):
        return []


def stop_apiserver(cluster: Cluster) -> None:
    """For tests of an API server restart: etcd (and so every object) stays. The time is
    recorded (:func:`restarted_at`) for the real tier's RBAC audit."""
    with (cluster.state / "apiserver-restarts").open("a") as f:
        f.write(f"{time.time():.3f}\n")
    _stop(cluster, "kube-apiserver")


def restart_apiserver(cluster: Cluster, *, down_seconds: float = 0.0) -> None:
    """Stop kube-apiserver, leave it down ``down_seconds``, start it again and wait until it
    is ready; etcd keeps every object, so clients see the same resourceVersions after."""
    bin_dir = build()
    stop_apiserver(cluster)
    if down_seconds:
        time.sleep(down_seconds)
    start_apiserver(cluster, bin_dir)


def wipe_etcd(cluster: Cluster) -> None:
    """Stop etcd, delete its data and start it empty while kube-apiserver keeps running: for
    the test of storage that goes back in time under the API server (it destroys CRDs and
    RBAC too, so only on a cluster of that test's own)."""
    bin_dir = build()
    _stop(cluster, "etcd")
    shutil.rmtree(cluster.state / "etcd", ignore_errors=True)
    _start_etcd(cluster, bin_dir)


def stop_controller_manager(cluster: Cluster) -> None:
    """For benchmarks with kubelet-less nodes (its node lifecycle controller would mark them
    NotReady): stopped until :func:`start_controller_manager`."""
    _stop(cluster, "kube-controller-manager")


def start_controller_manager(cluster: Cluster) -> None:
    _start_controller_manager(cluster, build())


def _kcm_client_limits() -> list[str]:
    """``MUSTER_CLUSTER_KCM_API_QPS=N``: the controller-manager's client rate limit (burst
    2N). Unset, it keeps its default of 20 QPS per controller, which bounds how fast the node
    lifecycle controller lifts new nodes' not-ready taint (benchmarks/controller_bench.py)."""
    qps = os.environ.get("MUSTER_CLUSTER_KCM_API_QPS")
    if not qps:
        return []
    try:
        value = int(qps)
    except ValueError:
        raise ClusterError(f"MUSTER_CLUSTER_KCM_API_QPS must be an integer, got {qps!r}") from None
    return [f"--kube-api-qps={value}", f"--kube-api-burst={2 * value}"]


def _start_controller_manager(cluster: Cluster, bin_dir: Path) -> None:
    pki = cluster.state / "pki"
    kc = str(cluster.admin_kubeconfig)
    _start(cluster, "kube-controller-manager", [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={cluster.ports.controller_manager}",
        "--leader-elect=false", "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--feature-gates={FEATURE_GATES}",
        *_kcm_client_limits(),
        "--v=1",
    ])


def _start_scheduler(cluster: Cluster, bin_dir: Path) -> None:
    kc = str(cluster.admin_kubeconfig)
    _start(cluster, "kube-scheduler", [
        str(bin_dir / "kube-scheduler"),
        f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={cluster.ports.scheduler}",
        "--leader-elect=false",
        f"--feature-gates={FEATURE_GATES}",
        "--v=1",
    ])


def _kwok_stages(bin_dir: Path, dest: Path) -> Path:
    """kwok's own "fast" stages (node init, lease heartbeat, pods Ready, deletion finished),
    copied from its module by build.sh."""
    stages = _cache_dir(bin_dir) / "kwok-stages"
    docs = [doc for p in sorted(stages.glob("*.yaml"))
            if (doc := yaml.safe_load(p.read_text())) and doc.get("kind") == "Stage"]
    if not docs:
        raise ClusterError(f"no kwok stages in {stages}; rerun hack/cluster/build.sh")
    for doc in docs:
        if doc["metadata"]["name"] == "node-initialize":
            # A simulated boot: the fake provider's readyDelaySeconds, as an annotation.
            doc["spec"]["delay"] = {
                "durationMilliseconds": 0,
                "durationFrom": {
                    "expressionFrom": f'.metadata.annotations["{BOOT_DELAY_ANNOTATION}"]'},
            }
    dest.write_text(yaml.safe_dump_all(docs))
    return dest


def _start_kwok(cluster: Cluster, bin_dir: Path) -> None:
    config = _kwok_stages(bin_dir, cluster.state / "kwok-stages.yaml")
    _start(cluster, "kwok", [
        str(bin_dir / "kwok"), f"--kubeconfig={cluster.admin_kubeconfig}",
        f"--config={config}",
        # Every Node Muster's fake provider creates carries this annotation; nothing else
        # in the cluster is managed by kwok.
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        "--node-lease-duration-seconds=40",
        f"--server-address=127.0.0.1:{cluster.ports.kwok}",
        "--node-ip=127.0.0.1",
    ])
    _wait(cluster, "kwok",
          lambda: _get(f"http://127.0.0.1:{cluster.ports.kwok}/healthz") == 200, within=30)


def _kueue_config(cluster: Cluster, pki: Path) -> Path:
    p = cluster.ports
    certs = cluster.state / "kueue-certs"
    certs.mkdir(exist_ok=True)
    shutil.copy(pki / "kueue-webhook.crt", certs / "tls.crt")
    shutil.copy(pki / "kueue-webhook.key", certs / "tls.key")
    body = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{p.kueue_health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{p.kueue_metrics}"},
        "webhook": {"port": p.kueue_webhook, "host": "127.0.0.1", "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["batch/job"]},
        "clientConnection": {"qps": 100, "burst": 200},
    }
    path = cluster.state / "kueue-config.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _kueue_webhooks(cluster: Cluster, bin_dir: Path, pki: Path) -> str:
    """Kueue's webhook configurations, pointed at 127.0.0.1 with our CA."""
    import base64

    source = _cache_dir(bin_dir) / "kueue-webhooks.yaml"
    ca = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
    docs = []
    for doc in yaml.safe_load_all(source.read_text()):
        if not doc:
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if not any(part in path for part in KUEUE_WEBHOOK_PATHS):
                continue
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{cluster.ports.kueue_webhook}{path}",
                "caBundle": ca,
            }
            hooks.append(hook)
        doc["webhooks"] = hooks
        doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
        docs.append(doc)
    return yaml.safe_dump_all(docs)


KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
"""Kueue 0.17 reads its metrics serving certificate from this fixed path whenever its internal
cert management is off (a pod mounts a Secret there), exits without one, and has no flag or
config field to read it from elsewhere."""

# Run by sh in a mount namespace of Kueue's own (unshare): /etc becomes an overlay whose
# writable layer is a tmpfs of that namespace, and the state directory's certificates are
# bound at KUEUE_METRICS_CERTS in it; nothing reaches the machine's /etc, and two clusters on
# one machine each give their Kueue their own certificate.
_PRIVATE_ETC = """
set -eu
certs=$1 scratch=$2 target=$3
shift 3
mount -t tmpfs muster-kueue-etc "$scratch"
mkdir "$scratch/upper" "$scratch/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$scratch/upper,workdir=$scratch/work" /etc
mkdir -p "$target"
mount --bind "$certs" "$target"
exec "$@"
"""


def _kueue_metrics_certs(cluster: Cluster, pki: Path) -> Path:
    """The state directory's copy of what Kueue serves metrics with (the webhook's
    certificate: metrics are served on 127.0.0.1 only)."""
    certs = cluster.state / "kueue-metrics-certs"
    certs.mkdir(parents=True, exist_ok=True)
    for name, src in (("tls.crt", "kueue-webhook.crt"), ("tls.key", "kueue-webhook.key")):
        shutil.copy(pki / src, certs / name)
    return certs


def _unshare() -> list[str]:
    # Without root, a user namespace (mapping the user to root in it) allows the mounts.
    return ["unshare", "--mount", "--propagation", "private",
            *([] if os.geteuid() == 0 else ["--map-root-user"])]


def with_private_etc(cluster: Cluster, certs: Path, argv: list[str]) -> list[str]:
    """``argv`` run with :data:`KUEUE_METRICS_CERTS` showing ``certs``, in a mount namespace
    of its own; the same pid (unshare and sh exec), so pid files and stop work unchanged."""
    scratch = cluster.state / "kueue-etc"
    scratch.mkdir(parents=True, exist_ok=True)
    if "," in str(scratch) or ":" in str(scratch):
        raise ClusterError(f"the state directory {cluster.state} must not contain ',' or ':' "
                           "(Kueue's /etc overlay names it in mount options)")
    probe = subprocess.run([*_unshare(), "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        raise ClusterError(
            f"Kueue needs its metrics certificate at {KUEUE_METRICS_CERTS} (fixed in Kueue "
            f"0.17); the harness mounts it there in a namespace of Kueue's own rather than "
            f"write the machine's /etc, and unshare failed: {probe.stderr.strip()}. Run as "
            "root or allow unprivileged user namespaces (sysctl "
            "kernel.unprivileged_userns_clone=1, kernel.apparmor_restrict_unprivileged_userns=0)")
    return [*_unshare(), "sh", "-c", _PRIVATE_ETC, "kueue-private-etc", str(certs), str(scratch),
            str(KUEUE_METRICS_CERTS), *argv]


def _start_kueue(cluster: Cluster, bin_dir: Path, pki: Path) -> None:
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f",
            str(_cache_dir(bin_dir) / "kueue-crds"))
    kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s", "-f",
            str(_cache_dir(bin_dir) / "kueue-crds"))
    kubectl(cluster, "create", "namespace", "kueue-system", check=False)
    config = _kueue_config(cluster, pki)
    _start(cluster, "kueue", with_private_etc(cluster, _kueue_metrics_certs(cluster, pki), [
        str(bin_dir / "kueue"), f"--config={config}",
        f"--kubeconfig={cluster.admin_kubeconfig}",
        # No aggregated API here: the visibility server would need an APIService and a Service.
        "--feature-gates=VisibilityOnDemand=false",
        "--zap-log-level=info",
    ]))
    _wait(cluster, "kueue",
          lambda: _get(f"http://127.0.0.1:{cluster.ports.kueue_health}/readyz") == 200,
          within=60)
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", "-",
            stdin=_kueue_webhooks(cluster, bin_dir, pki))


def install_mode() -> str:
    """``MUSTER_CLUSTER_INSTALL``: ``kustomize`` (default: ``config/rbac`` and its parts) or
    ``chart`` (``helm install`` of ``charts/muster``, so the tier runs as the chart's
    ServiceAccount)."""
    mode = os.environ.get("MUSTER_CLUSTER_INSTALL", "kustomize")
    if mode not in ("kustomize", "chart"):
        raise ClusterError(f"MUSTER_CLUSTER_INSTALL must be kustomize or chart, got {mode!r}")
    return mode


def helm_binary() -> str:
    done = subprocess.run([str(ROOT / "hack" / "install-helm.sh")], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"hack/install-helm.sh failed: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def helm_homes(cluster: Cluster) -> dict[str, str]:
    """helm's cache, config and data directories in the state directory (not ~/.cache/helm,
    ~/.config/helm, ~/.local/share/helm)."""
    home = cluster.state / "helm"
    return {"HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data")}


# The chart's Deployment is installed as a user would, but nothing here can run its image
# (kwok only pretends): its pods must not land on the fake provider's nodes, where kwok would
# mark them Running and keep those nodes busy. Muster runs as a process instead (e2e/real.py).
CHART_E2E_VALUES = {
    "rbac": {"fakeProvider": True, "kueue": True},
    "nodeSelector": {"muster.dev/e2e-unschedulable": "true"},
}


def _install_muster(cluster: Cluster) -> None:
    """The CRDs Muster serves, its RBAC and its admission policies, exactly as shipped."""
    kubectl(cluster, "apply", "--server-side", "--force-conflicts",
            "-k", str(ROOT / "config" / "crds" / "provisioningrequest"))
    if install_mode() == "chart":
        values = cluster.state / "chart-values.yaml"
        values.write_text(yaml.safe_dump(CHART_E2E_VALUES))
        done = subprocess.run(
            [helm_binary(), "--kubeconfig", str(cluster.admin_kubeconfig), "upgrade",
             "--install", "muster", str(ROOT / "charts" / "muster"), "--namespace",
             MUSTER_NAMESPACE, "--create-namespace", "--values", str(values), "--wait=false"],
            capture_output=True, text=True, check=False, env={**os.environ, **helm_homes(cluster)})
        if done.returncode != 0:
            raise ClusterError(f"helm install of charts/muster failed: {done.stderr.strip()}")
    else:
        kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f",
                str(ROOT / "crds"))
        kubectl(cluster, "create", "namespace", MUSTER_NAMESPACE, check=False)
        for part in ("rbac", "rbac/fake-provider", "rbac/kueue", "admission"):
            if (ROOT / "config" / part / "kustomization.yaml").exists():
                kubectl(cluster, "apply", "--server-side", "--force-conflicts",
                        "-k", str(ROOT / "config" / part))
    kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s",
            "crd/provisioningrequests.autoscaling.x-k8s.io", "crd/capacitypools.muster.dev")


def _muster_kubeconfig(cluster: Cluster) -> None:
    token_kubeconfig(cluster, cluster.muster_kubeconfig, MUSTER_SA, MUSTER_NAMESPACE)


def token_kubeconfig(cluster: Cluster, path: Path, account: str, namespace: str) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (a TokenRequest token)."""
    _kubeconfig(cluster, path, {"token": service_account_token(cluster, account, namespace)})
    return path


def service_account_token(cluster: Cluster, account: str, namespace: str, *,
                          duration: str = "48h", audience: str | None = None) -> str:
    """A token of the ServiceAccount from the TokenRequest API, as a pod's projected token
    is (``audience``: for another audience than the API server's)."""
    extra = [f"--audience={audience}"] if audience else []
    return kubectl(cluster, "create", "token", account, "-n", namespace,
                   f"--duration={duration}", *extra).stdout.strip()


# --------------------------------------------------------------------------- up / down


def running(cluster: Cluster) -> bool:
    if any(_pid(cluster, c) is None for c in COMPONENTS):
        return False
    if not cluster.admin_kubeconfig.exists() or not cluster.muster_kubeconfig.exists():
        return False
    mode = cluster.state / "install-mode"
    if not mode.exists() or mode.read_text().strip() != install_mode():
        return False  # up again: Muster installed the other way
    ctx = _ssl_context(cluster, client=True)
    return _get(f"{cluster.server}/readyz", ctx) == 200


def up(cluster: Cluster | None = None, *, bare: bool = False) -> Cluster:
    """Start (or reuse) the control plane; returns it with both kubeconfigs written.

    ``bare``: only Kubernetes itself (etcd, apiserver, controller-manager, scheduler, kwok),
    for a test that installs Muster as a user would (e2e/test_install_real.py); no Kueue, no
    Muster kubeconfig, and never reused."""
    cluster = cluster or default_cluster()
    if not bare and running(cluster):
        return cluster
    start = time.monotonic()
    bin_dir = build()
    down(cluster, quiet=True)
    cluster.state.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(cluster.state / "etcd", ignore_errors=True)
    shutil.rmtree(cluster.logs, ignore_errors=True)
    pki = certificates(cluster)
    _kubeconfig(cluster, cluster.admin_kubeconfig, {
        "client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key")})
    try:
        progress("starting etcd")
        _start_etcd(cluster, bin_dir)
        progress("starting kube-apiserver")
        start_apiserver(cluster, bin_dir)
        progress("starting kube-controller-manager, kube-scheduler, kwok")
        _start_controller_manager(cluster, bin_dir)
        _start_scheduler(cluster, bin_dir)
        _start_kwok(cluster, bin_dir)
        if not bare:
            progress(f"installing CRDs and Muster's RBAC ({install_mode()})")
            _install_muster(cluster)
            (cluster.state / "install-mode").write_text(install_mode() + "\n")
            progress("starting Kueue")
            _start_kueue(cluster, bin_dir, pki)
            _muster_kubeconfig(cluster)
        _wait_components(cluster)
    except BaseException:
        down(cluster, quiet=True)
        raise
    (cluster.state / "up-seconds").write_text(f"{time.monotonic() - start:.1f}\n")
    progress(f"ready in {time.monotonic() - start:.1f} s: export "
             f"KUBECONFIG={cluster.admin_kubeconfig}")
    return cluster


def _wait_components(cluster: Cluster) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # their self-signed serving certs; only /healthz is read
    for name, port in (("kube-controller-manager", cluster.ports.controller_manager),
                       ("kube-scheduler", cluster.ports.scheduler)):
        _wait(cluster, name, lambda port=port: _get(
            f"https://127.0.0.1:{port}/healthz", ctx) == 200, within=60)
    # The service-account controller makes "default" in each namespace; pods need it.
    _wait(cluster, "kube-controller-manager", lambda: kubectl(
        cluster, "get", "serviceaccount", "default", "-n", "default", check=False
    ).returncode == 0, within=60)


def down(cluster: Cluster | None = None, *, quiet: bool = False) -> None:
    """Stop every component (reverse order) and check that no process is left."""
    cluster = cluster or default_cluster()
    for component in reversed(COMPONENTS):
        _stop(cluster, component)
    left = list(_leftovers(cluster))
    if left:
        raise ClusterError(f"processes left after down: {left}")
    if not quiet:
        progress("stopped")


def _leftovers(cluster: Cluster) -> Iterator[str]:
    """Processes still running from this cluster's state directory (by their arguments)."""
    # With the separator: another cluster's state directory may start with this one's name
    # (.cluster and .cluster-soak), and its processes are not ours to report.
    marker = str(cluster.state).rstrip("/") + "/"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and _alive(int(proc.name)) and any(
            c in cmdline.split(" ", 1)[0] for c in COMPONENTS
        ):
            yield f"{proc.name}: {cmdline[:120]}"


def status(cluster: Cluster) -> dict[str, Any]:
    return {
        "state": str(cluster.state),
        "server": cluster.server,
        "kubernetes": cluster.version(),
        "components": {c: _pid(cluster, c) for c in COMPONENTS},
        "ready": running(cluster),
        "admin_kubeconfig": str(cluster.admin_kubeconfig),
        "muster_kubeconfig": str(cluster.muster_kubeconfig),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m e2e.cluster", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status", "build"])
    args = parser.parse_args(argv)
    cluster = default_cluster()
    try:
        if args.command == "build":
            print(build())
        elif args.command == "up":
            up(cluster)
            print(f"export KUBECONFIG={cluster.admin_kubeconfig}")
        elif args.command == "down":
            down(cluster)
        else:
            print(json.dumps(status(cluster), indent=2))
    except ClusterError as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
