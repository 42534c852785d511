"""Lease-based leader election, so that only one Muster replica acts at a time.

The protocol is client-go's ``leaderelection`` with a ``coordination.k8s.io/v1`` Lease (what
controller-runtime and kube-controller-manager use), so its behaviour is the one operators
know:

- The Lease spec holds ``holderIdentity``, ``leaseDurationSeconds``, ``acquireTime``,
  ``renewTime`` and ``leaseTransitions``. Every write is conditional on the
  ``resourceVersion`` read just before (a merge patch naming ``metadata.resourceVersion`` is
  rejected with 409 Conflict when the Lease changed meanwhile), so two candidates can never
  both believe they wrote the same transition.
- A candidate takes a Lease that is free (no holder: released) or whose record it has seen
  unchanged for the record's ``leaseDurationSeconds``, measured on its *own* clock from the
  moment it observed the record. No two clocks are compared, so clock skew between replicas
  does not matter.
- The leader renews every ``retry_period``; if no renewal succeeds within ``renew_deadline``
  of the last one (or the Lease names another holder) it has lost: it says so at once
  (``lost`` is set and the callbacks run synchronously, before any other task runs) and must
  stop acting. As ``renew_deadline < lease_duration``, the old leader has stopped before any
  other replica can take over, counting from the moment the last successful renewal was sent.
- Releasing on a clean shutdown writes an empty holder, so a standby takes over at its next
  retry instead of waiting out the lease duration.

Deadlines run on the event loop's monotonic clock, not on the injected :class:`Clock`: a
wall-clock step (NTP) must never stretch a leader's belief that it still holds the Lease.
The injected clock only stamps ``acquireTime``/``renewTime``, which are informational.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from controller.common.clock import Clock, RealClock
from controller.config import LeaderElectionConfig
from controller.kube import ApiError, Body, KubeClient
from controller.kube.resources import LEASES

log = logging.getLogger(__name__)

JITTER_FACTOR = 1.2
"""As client-go: a candidate waits between ``retry_period`` and ``2.2 x retry_period`` between
attempts, so standbys that started together do not hit the API server in lockstep."""
EXPIRY_MARGIN = 0.05
"""A standby tries this long after the Lease it watches expires (by its own clock)."""

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "muster-system"


class LeadershipLost(Exception):
    """This replica held the Lease and lost it; it must stop acting (and exit)."""


def default_identity() -> str:
    """``<hostname>_<uuid>`` like controller-runtime: the pod name tells operators which
    replica leads; the uuid keeps a restarted container from mistaking its predecessor's
    record for its own."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def lease_namespace(configured: str | None, sa_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The configured namespace, else the pod's own (its service-account namespace file),
    else ``muster-system`` (running outside a cluster)."""
    if configured:
        return configured
    try:
        own = sa_file.read_text().strip()
    except OSError:
        return DEFAULT_NAMESPACE
    return own or DEFAULT_NAMESPACE


def micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime (the Lease's time fields), e.g. ``2026-01-01T00:00:00.000000Z``."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for one Lease and, once it leads, keeps renewing it in the background.

    ``await acquire()`` returns once this replica leads; from then on :attr:`is_leader` is
    true until :meth:`release` or until the lease is lost (:attr:`lost` set, ``on_lost``
    callbacks called). One elector campaigns once: after losing, the process is expected to
    exit and start afresh, as controller-runtime's managers do.
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        name: str,
        namespace: str,
        identity: str | None = None,
        lease_duration_seconds: int = 8,
        renew_deadline_seconds: float = 6.0,
        retry_period_seconds: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        if lease_duration_seconds < 1:
            raise ValueError("lease_duration_seconds must be at least 1")
        if not lease_duration_seconds > renew_deadline_seconds:
            raise ValueError("lease_duration_seconds must be greater than renew_deadline_seconds")
        if not renew_deadline_seconds > JITTER_FACTOR * retry_period_seconds:
            raise ValueError(
                f"renew_deadline_seconds must be greater than {JITTER_FACTOR} x "
                "retry_period_seconds"
            )
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self.identity = identity or default_identity()
        self.lease_duration = lease_duration_seconds
        self.renew_deadline = renew_deadline_seconds
        self.retry_period = retry_period_seconds
        self.clock = clock or RealClock()
        self.attempt_timeout = renew_deadline_seconds / 2
        """Bound of one attempt (its requests): half the renew deadline, so a request hanging
        on a dead connection leaves time for a second attempt before the leader gives up."""
        self.lost = asyncio.Event()
        """Set when this replica led and stopped leading other than by :meth:`release`."""
        self.holder: str = ""
        """The holder in the last record seen ("" when free or not read yet)."""
        self.last_error: str | None = None
        """Why the last attempt reached no verdict (API server unreachable, 5xx, forbidden,
        no namespace); None when it won, found the Lease held, or lost a race (409)."""
        self.conflicts = 0
        """Writes refused with 409 Conflict (the Lease changed between read and write)."""
        self._logged_error: str | None = None
        self.transitions = 0
        """``leaseTransitions`` of the last record seen."""
        self._observed_spec: Body | None = None
        self._observed_at = 0.0
        self._rv = ""
        self._leading = False
        self._renewed_at = 0.0
        self._callbacks: list[Callable[[], None]] = []
        self._renewer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ state

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def is_leader(self) -> bool:
        """Leading now: acquired, not released, not lost, and renewed within the deadline.

        The deadline is checked here too, not only by the renewal task, so a caller that
        asks while the renewal is late (a stalled API server) already gets False.
        """
        return self._leading and self._now() < self._renewed_at + self.renew_deadline

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` synchronously the moment leadership is lost (to stop acting
        before any other coroutine gets to run)."""
        self._callbacks.append(callback)

    # ------------------------------------------------------------------ campaign

    async def acquire(self) -> None:
        """Return once this replica holds the Lease (retrying every jittered retry period)."""
        if self.lost.is_set():
            raise LeadershipLost(f"lease {self.key} was lost; an elector campaigns only once")
        waiting_for: str | None = None
        while True:
            if await self._attempt(within=self.attempt_timeout):
                break
            if self.holder and self.holder != waiting_for:
                waiting_for = self.holder
                log.info("lease %s is held by %s; standing by", self.key, self.holder)
            await asyncio.sleep(self._next_attempt_in())
        self._leading = True
        log.info("acquired lease %s as %s (transitions %d)", self.key, self.identity,
                 self.transitions)
        self._renewer = asyncio.create_task(self._renew_loop(), name="lease-renew")

    def _next_attempt_in(self) -> float:
        """A jittered retry period, or less: the moment the holder's record will have stood
        unchanged for its lease duration. Takeover then comes at the lease duration after
        the standby saw the last renewal, not up to 2.2 retry periods later."""
        wait = self.retry_period * (1 + random.random() * JITTER_FACTOR)
        spec = self._observed_spec
        if spec and self.holder and self.holder != self.identity:
            duration = int(spec.get("leaseDurationSeconds") or 0)
            expires_in = self._observed_at + duration - self._now()
            wait = min(wait, max(0.0, expires_in) + EXPIRY_MARGIN)
        return wait

    async def _renew_loop(self) -> None:
        try:
            while self._leading:
                await asyncio.sleep(self.retry_period)
                while self._leading:
                    remaining = self._renewed_at + self.renew_deadline - self._now()
                    if remaining <= 0:
                        self._lose(f"no renewal succeeded within {self.renew_deadline:g}s "
                                   f"(last error: {self.last_error}; conflicts so far: "
                                   f"{self.conflicts})")
                        return
                    if await self._attempt(within=min(remaining, self.attempt_timeout)):
                        break
                    if self.holder and self.holder != self.identity:
                        self._lose(f"the lease now names {self.holder}")
                        return
                    await asyncio.sleep(min(self.retry_period, max(0.0, remaining)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not leave a leader that no longer renews
            log.exception("lease renewal failed unexpectedly")
            self._lose(f"renewal crashed: {exc!r}")

    def _lose(self, why: str) -> None:
        if not self._leading:
            return
        self._leading = False
        log.error("lost lease %s: %s", self.key, why)
        self.lost.set()
        for callback in self._callbacks:
            try:
                callback()
            except Exception:
                log.exception("leadership-lost callback failed")

    async def _attempt(self, *, within: float) -> bool:
        """One try to acquire or renew; False on any failure (the caller retries)."""
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation
            # that arrives as the request completes, and a renewal loop that survives
            # release() would renew a Lease this replica meant to hand over.
            async with asyncio.timeout(within):
                acquired = await self._try_acquire_or_renew()
        except TimeoutError:
            self.last_error = f"no answer from the API server within {within:.3g}s"
            return False
        except ApiError as exc:
            self.last_error = _describe(exc, self)
            if self.last_error != self._logged_error:  # once per distinct error, not per retry
                log.warning("lease %s: %s", self.key, self.last_error)
            self._logged_error = self.last_error
            return False
        self.last_error = None
        self._logged_error = None
        return acquired

    async def _try_acquire_or_renew(self) -> bool:
        # Taken before the first request: the server records the renewal after this moment,
        # so others count their lease duration from later than this; measuring our own
        # deadline from here keeps the leader's belief strictly shorter than theirs.
        sent = self._now()
        stamp = micro_time(self.clock.now())
        lease = await self.kube.get_or_none(LEASES, self.name, namespace=self.namespace)
        if lease is None:
            body = {
                "apiVersion": LEASES.api_version, "kind": LEASES.kind,
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._record(acquire_time=stamp, renew_time=stamp, transitions=0),
            }
            try:
                created = await self.kube.create(LEASES, body, namespace=self.namespace)
            except ApiError as exc:
                if exc.status == 409:  # another candidate created it first
                    return False
                raise
            self._observe(created)
            self._renewed_at = sent
            return True
        self._observe(lease)
        spec = self._observed_spec or {}
        holder = str(spec.get("holderIdentity") or "")
        duration = int(spec.get("leaseDurationSeconds") or 0)
        if holder and holder != self.identity and self._now() < self._observed_at + duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquire_time = str(spec.get("acquireTime") or stamp)
        else:
            acquire_time, transitions = stamp, transitions + 1
        patch = {
            "metadata": {"resourceVersion": self._rv},
            "spec": self._record(acquire_time=acquire_time, renew_time=stamp,
                                 transitions=transitions),
        }
        try:
            updated = await self.kube.merge_patch(LEASES, self.name, patch,
                                                  namespace=self.namespace)
        except ApiError as exc:
            if exc.conflict:  # someone wrote the Lease since our read: decide again next time
                self.conflicts += 1
                return False
            raise
        self._observe(updated)
        self._renewed_at = sent
        return True

    def _record(self, *, acquire_time: str, renew_time: str, transitions: int) -> Body:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_duration,
            "acquireTime": acquire_time,
            "renewTime": renew_time,
            "leaseTransitions": transitions,
        }

    def _observe(self, lease: Body) -> None:
        spec = dict(lease.get("spec") or {})
        self._rv = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        if spec != self._observed_spec:
            # The lease duration runs from when *we* saw the record change, never from the
            # renewTime written by another machine's clock.
            self._observed_spec = spec
            self._observed_at = self._now()
        self.holder = str(spec.get("holderIdentity") or "")
        self.transitions = int(spec.get("leaseTransitions") or 0)

    # ------------------------------------------------------------------ release

    async def release(self) -> bool:
        """Stop renewing and, if still leading, hand the Lease back (empty holder, 1 s
        duration) so a standby takes over at its next retry. True when handed back."""
        was_leading = self.is_leader
        self._leading = False
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None
        if not was_leading:
            return False
        deadline = self._now() + self.renew_deadline
        why = "conflicts"
        # A few tries, each bounded: a renewal cancelled by release() may still land (requests
        # are shielded from cancellation) and make our resourceVersion stale, and one request
        # stuck on a dead pooled connection must not cost the whole hand-over.
        for _ in range(3):
            remaining = deadline - self._now()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(min(remaining, self.attempt_timeout)):
                    outcome = await self._hand_back()
            except TimeoutError:
                why = f"no answer within {self.attempt_timeout:.3g}s"
                continue
            except ApiError as exc:
                why = _describe(exc, self)
                break
            if outcome is None:  # conflict: read again
                continue
            if outcome:
                log.info("released lease %s", self.key)
            return outcome
        # Not fatal: the standby takes over when the lease expires instead.
        log.warning("could not release lease %s (a standby takes over after %ds): %s",
                    self.key, self.lease_duration, why)
        return False

    async def _hand_back(self) -> bool | None:
        """Read, then write an empty holder under that resourceVersion: True when done, False
        when the Lease is not ours (any more), None on a conflict."""
        lease = await self.kube.get_or_none(LEASES, self.name, namespace=self.namespace)
        if lease is None:
            return False
        self._observe(lease)
        if self.holder != self.identity:
            return False
        stamp = micro_time(self.clock.now())
        patch: Body = {
            "metadata": {"resourceVersion": self._rv},
            "spec": {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": self.transitions,
            },
        }
        try:
            self._observe(await self.kube.merge_patch(LEASES, self.name, patch,
                                                      namespace=self.namespace))
        except ApiError as exc:
            if exc.conflict:
                self.conflicts += 1
                return None
            raise
        return True

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()


def _describe(exc: ApiError, elector: LeaderElector) -> str:
    if exc.status == 404 and "namespaces" in exc.body:
        return (
            f"namespace {elector.namespace} does not exist: create it or set "
            "leader_election.namespace (MUSTER_LEADER_ELECTION__NAMESPACE)"
        )
    if exc.status == 403:
        return (
            f"forbidden to read or write leases in {elector.namespace} (the RBAC in "
            f"config/rbac/leader_election_role.yaml grants it): {exc}"
        )
    return str(exc)


def from_config(kube: KubeClient, config: LeaderElectionConfig, *, clock: Clock | None = None,
                identity: str | None = None) -> LeaderElector:
    """An elector from the ``leader_election`` section of Muster's config."""
    return LeaderElector(
        kube,
        name=config.lease_name,
        namespace=lease_namespace(config.namespace),
        identity=identity,
        lease_duration_seconds=config.lease_duration_seconds,
        renew_deadline_seconds=config.renew_deadline_seconds,
        retry_period_seconds=config.retry_period_seconds,
        clock=clock,
    )
