"""Queued provisioning (``queued-provisioning.muster.dev``) and the run duration bound.

A request of a queued class is planned and booked like an atomic one; what differs is what a
stock-out does to it:

* **The cloud's queue.** When every group of the plan is in a pool whose provider queues
  (:class:`providers.base.CapacityQueue`: GCP flex-start resize requests, the fake cloud's
  ``queue: true``), each group is *enqueued* under its acquisition key instead of acquired,
  all or nothing, with ``maxRunDurationSeconds`` as the run it asks for. The request stays
  in phase Acquiring with ``Provisioned=False``/``QueuedForCapacity`` saying since when, the
  cloud's state per group, and the cloud's estimate where it gives one; it asks the queue
  again every ``acquisition.queue_poll_seconds``. Once every group is granted, the normal
  acquisition adopts the nodes under the same keys, waits for Ready and books. A queued
  request that the cloud ends (FAILED, CANCELLED) is cancelled everywhere and planned again.
* **Muster's own queue.** Otherwise (a provider without a queue: AWS, a fake pool without
  one) a stock-out, in planning or at the cloud, never uses up the request's attempts: the
  request waits with ``QueuedForCapacity`` and is planned again when capacity may have freed
  (:class:`~controller.state.wakeups.Wakeups`: a pool changed, nodes went) or at its backoff,
  whichever is first. It never ends ``RetriesExhausted``; it waits until deleted.

Deleting the request (or Kueue withdrawing it) cancels every group's queued request and
releases whatever a grant created (:func:`leave`); a cancel the cloud refuses keeps the
request (its finalizer) and is tried again every poll.

**A pool deleted under a queued gang.** The pool's finalizer holds it while a request of a
queued class waits in its queue (:func:`waiting_pools`; the cancel needs the pool's provider
settings). The request's next look (a pool change wakes it, else the next poll) cancels every
group's queued request and releases what a grant created, then the request fails with
``Failed=True``/``CapacityPoolDeleted``; only then is the pool let go. A cancel the cloud
refuses is tried again every poll, the request still Acquiring and the pool still held, so
nothing is left queued in the cloud under a pool that no longer exists.

**A pool whose provider changes under a queued gang.** The provider and parameters each group
was queued through are kept on the request (``muster.dev/queued-through``). When the pool
names another provider at the next look, the queued request is cancelled through the one
that queued it (with the parameters it was queued with) and the gang is planned again
(``AcquisitionFailed`` saying so); deleting the request cancels through it too.

**Run duration.** A provisioned request with ``maxRunDurationSeconds`` (any provisioning
class: Kueue forwards the parameter from its ProvisioningRequestConfig) has its new nodes
released that many seconds after ``Provisioned=True``, running pods or not, and the booking
ends with ``CapacityRevoked=True``/``RunDurationExpired`` (:func:`expire_run`). Kueue reads
CapacityRevoked as the capacity being taken back and evicts the Workload, as GKE's
queued-provisioning class does when its run ends. The time is the injected clock's.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from controller.acquire.groups import AcquisitionFailed, release_groups
from controller.acquire.registration import registration_budget
from controller.api.capacitypool import CapacityPool
from controller.common.conditions import ConditionType, Reason, message, rfc3339
from controller.common.decision_log import log_decision
from controller.lifecycle import (
    ATTEMPT_ANNOTATION,
    PHASE_ANNOTATION,
    PLAN_ANNOTATION,
    QUEUED_SINCE_ANNOTATION,
    QUEUED_THROUGH_ANNOTATION,
    RETRY_AT_ANNOTATION,
    Event,
    Phase,
)
from controller.state.bookings import Booking, Group
from controller.state.requests import RequestRecord, parse_time
from providers.base import (
    ENDED,
    GRANTED,
    AcquireRequest,
    CapacityQueue,
    CapacityUnavailable,
    ProviderError,
    QueuedStatus,
)
from providers.registry import canonical

if TYPE_CHECKING:
    from controller.config import ClassesConfig
    from controller.reconcilers.provisioning.base import Delay
    from controller.reconcilers.provisioning.outcome import Outcomes
    from controller.state.cache import ClusterState

log = logging.getLogger(__name__)

def is_queued(svc: Outcomes, req: RequestRecord) -> bool:
    return svc.config.classes.is_queued(req.class_name)


def run_seconds(svc: Outcomes, req: RequestRecord) -> int | None:
    return svc.parameters(req).values.max_run_duration_seconds


def queue_of(svc: Outcomes, pool: CapacityPool) -> CapacityQueue | None:
    """The pool's provider as a queue, when the pool's parameters name one."""
    try:
        provider = svc.providers.get(pool.spec.provider)
    except ProviderError:
        return None
    if not isinstance(provider, CapacityQueue):
        return None
    try:
        return provider if provider.queues(pool) else None
    except (ProviderError, ValueError):
        return None  # unreadable parameters: the acquisition's validate says why


def _queues(svc: Outcomes, req: RequestRecord,
            booking: Booking) -> list[tuple[CapacityPool, CapacityQueue]] | None:
    """Each group's pool and queue when the request is queued and every group has one."""
    if not is_queued(svc, req) or not booking.groups:
        return None
    pools = svc.state.pool_registry.pools()
    out = []
    for group in booking.groups:
        pool = pools.get(group.pool)
        queue = queue_of(svc, pool) if pool is not None else None
        if pool is None or queue is None:
            return None
        out.append((pool, queue))
    return out


def _through(req: RequestRecord) -> dict[str, dict[str, Any]]:
    """Key -> the provider and parameters its gang was queued through (unreadable: none)."""
    text = req.annotations.get(QUEUED_THROUGH_ANNOTATION)
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items()
            if isinstance(v, dict) and isinstance(v.get("provider"), str)}


def _queued_through(svc: Outcomes, req: RequestRecord,
                    group: Group) -> tuple[CapacityPool, CapacityQueue] | None:
    """The group's pool as its gang was queued through (the recorded provider and
    parameters over the pool's current ones) and that pool's queue, or None."""
    pool = svc.state.pool_registry.pools().get(group.pool)
    if pool is None:
        return None
    was = _through(req).get(group.key)
    if was is not None and (canonical(was["provider"]) != canonical(pool.spec.provider)
                            or was.get("parameters") != pool.spec.parameters):
        spec = pool.spec.model_copy(update={
            "provider": was["provider"], "parameters": dict(was.get("parameters") or {})})
        pool = pool.model_copy(update={"spec": spec})
    queue = queue_of(svc, pool)
    return None if queue is None else (pool, queue)


def _moved(svc: Outcomes, req: RequestRecord, booking: Booking) -> list[str]:
    """The groups whose pool names another provider than the one that queued them."""
    through = _through(req)
    pools = svc.state.pool_registry.pools()
    out = []
    for group in booking.groups:
        was, pool = through.get(group.key), pools.get(group.pool)
        if was is not None and pool is not None and canonical(was["provider"]) != canonical(
                pool.spec.provider):
            out.append(f"CapacityPool {group.pool}'s provider changed from {was['provider']} "
                       f"to {pool.spec.provider}")
    return out


def stock_out(svc: Outcomes, req: RequestRecord, exc: AcquisitionFailed) -> Reason:
    """The reason an acquisition failure retries with: a queued request's stock-out waits
    for capacity like a plan that found none."""
    if is_queued(svc, req) and exc.retryable and exc.reason == CapacityUnavailable.reason:
        return Reason.CAPACITY_IS_NOT_FOUND
    return Reason.ACQUISITION_FAILED


def waiting_pools(state: ClusterState, classes: ClassesConfig) -> dict[str, list[str]]:
    """Pool -> the requests of a queued class that may still wait in its cloud queue: a
    group of their Acquiring booking was queued there (``muster.dev/queued-through``) and
    has no machine yet. The pool's finalizer stays until they have cancelled
    (:func:`step`), whether or not they were reconciled since a restart; a deleted pool
    wakes them, so they cancel at once rather than at their next poll."""
    held: dict[str, list[str]] = {}
    for key, req in state.objects.requests().items():
        booking = req.booking
        if (booking is None or req.phase is not Phase.ACQUIRING
                or not classes.is_queued(req.class_name)):
            continue
        through = _through(req)
        for pool in {g.pool for g in booking.groups
                     if g.key in through and not g.provider_ids and not g.nodes}:
            held.setdefault(pool, []).append(key)
    return held


# --------------------------------------------------------------------------- the cloud's queue


async def step(svc: Outcomes, req: RequestRecord, booking: Booking) -> Delay | bool:
    """Enqueue or look up every group of a queued request's booking. False: not served by
    a cloud's queue, or every group is granted (the caller's acquisition adopts the nodes);
    otherwise the reconcile's delay."""
    if not is_queued(svc, req) or not booking.groups:
        return False
    through = _through(req)
    # Before anything is asked of a queue: a deleting pool takes nothing new, and what its
    # queue holds is cancelled through the provider and parameters that queued it.
    registry = svc.state.pool_registry
    deleting = sorted({g.pool for g in booking.groups if registry.deleting(g.pool) and (
        g.key in through or _queued_through(svc, req, g) is not None)})
    if deleting:
        return await _pool_deleted(svc, req, booking, deleting)
    moved = _moved(svc, req, booking)
    if moved:
        return await _provider_changed(svc, req, booking, moved)
    queues = _queues(svc, req, booking)
    if queues is None:
        return False
    seconds = run_seconds(svc, req)
    try:
        statuses = await _look_up_or_enqueue(svc, req, booking, queues, seconds)
    except ProviderError as exc:
        await _cancel(svc, req, booking, why=f"enqueueing failed: {exc}")
        return await svc.retry_or_fail(
            req, attempt=booking.attempt, reason=Reason.ACQUISITION_FAILED,
            detail=f"the cloud's queue refused the gang: {exc}", permanent=not exc.retryable)
    ended = [(g, s) for g, s in zip(booking.groups, statuses, strict=True) if s.outcome == ENDED]
    if ended:
        what = "; ".join(f"pool {g.pool}: {s.name} {s.state}{': ' + s.error if s.error else ''}"
                         for g, s in ended)
        await _cancel(svc, req, booking, why=f"the cloud's queue ended it ({what})")
        return await svc.retry_or_fail(
            req, attempt=booking.attempt, reason=Reason.ACQUISITION_FAILED,
            detail=f"the cloud's queue ended the request ({what}); every group was cancelled")
    record = _through_record(booking, [pool for pool, _ in queues], statuses)
    if all(s.outcome == GRANTED for s in statuses):
        log_decision("acquire", req.key, outcome="granted", attempt=booking.attempt,
               groups=[f"{g.pool}:{s.name}" for g, s in zip(booking.groups, statuses,
                                                            strict=True)])
        if req.annotations.get(QUEUED_THROUGH_ANNOTATION) != record:
            # Where the cloud ends the run itself (a Capacity Block's end), run_end reads it.
            await svc.persist(req, annotations={QUEUED_THROUGH_ANNOTATION: record})
        return False
    since = req.annotations.get(QUEUED_SINCE_ANNOTATION) or min(
        (s.since for s in statuses if s.since), default="") or rfc3339(svc.clock.now())
    detail = "; ".join(
        f"pool {g.pool}: {g.count} node(s) in the cloud's queue as {s.name}, "
        f"state {s.state}" + (f" ({s.error})" if s.error else "")
        + (f", the cloud expects it by {s.estimate}" if s.estimate
           else ", no estimate from the cloud")
        for g, s in zip(booking.groups, statuses, strict=True))
    if seconds is not None:
        detail += f"; each to run {seconds}s once granted"
    svc.take(req, Event.QUEUED)
    if (QUEUED_SINCE_ANNOTATION not in req.annotations
            or req.annotations.get(QUEUED_THROUGH_ANNOTATION) != record):
        req = await svc.persist(req, annotations={QUEUED_SINCE_ANNOTATION: since,
                                                  QUEUED_THROUGH_ANNOTATION: record})
    await _write_queued(svc, req, since, detail)
    return svc.config.acquisition.queue_poll_seconds


async def _look_up_or_enqueue(svc: Outcomes, req: RequestRecord, booking: Booking,
                              queues: list[tuple[CapacityPool, CapacityQueue]],
                              seconds: int | None) -> list[QueuedStatus]:
    """Every group's place in its cloud's queue, enqueueing the groups not there yet. The
    registration budget is passed on: a cloud whose run clock starts when it creates the
    machines is asked for that much more than the run, so Muster's own end comes first."""
    ready_within = registration_budget((pool for pool, _ in queues),
                                       svc.config.acquisition.node_ready_timeout_seconds)
    statuses: list[QueuedStatus] = []
    for group, (pool, queue) in zip(booking.groups, queues, strict=True):
        found = await queue.queued(pool, group.key)
        if found is None:
            found = await queue.enqueue(AcquireRequest(
                key=group.key, pool=pool, count=group.count, domain=dict(group.domain),
                owner=req.key, owner_uid=req.uid), seconds, ready_within=ready_within)
            log_decision("acquire", req.key, outcome="queued", attempt=booking.attempt,
                         pool=group.pool, key=group.key, nodes=group.count,
                         run_seconds=seconds, ready_within=ready_within, state=found.state)
        statuses.append(found)
    return statuses


def _through_record(booking: Booking, pools: list[CapacityPool],
                    statuses: list[QueuedStatus]) -> str:
    """``muster.dev/queued-through``: per group's key, the provider and parameters it was
    queued through and, once granted, when the cloud ends the run itself."""
    return json.dumps({g.key: {"provider": pool.spec.provider,
                               "parameters": pool.spec.parameters,
                               **({"ends": st.ends} if st.ends else {})}
                       for g, pool, st in zip(booking.groups, pools, statuses, strict=True)},
                      sort_keys=True, separators=(",", ":"))


async def _pool_deleted(svc: Outcomes, req: RequestRecord, booking: Booking,
                        deleting: list[str]) -> Delay:
    """A pool of the booking is being deleted while the gang waits in the cloud's queue:
    cancel every group (all or nothing: the others are no use alone), then fail the request.
    While a cancel fails the request stays Acquiring, which keeps the pool's finalizer
    (:func:`waiting_pools`), and tries again at the next poll."""
    names = ", ".join(deleting)
    done: list[str] = []
    failures = await _cancel(svc, req, booking,
                             why=f"CapacityPool {names} is being deleted", done=done)
    if failures:
        poll = svc.config.acquisition.queue_poll_seconds
        since = req.annotations.get(QUEUED_SINCE_ANNOTATION) or rfc3339(svc.clock.now())
        await _write_queued(svc, req, since, (
            f"CapacityPool {names} is being deleted, but the cloud refused to cancel the "
            f"gang's queued request ({'; '.join(failures)}); Muster tries again every "
            f"{poll:.0f}s and keeps the pool until it succeeds"))
        return poll
    delay = await svc.fail(req, Reason.POOL_DELETED, message(
        Reason.POOL_DELETED, pools=names,
        cancelled="; ".join(done) or "nothing was held in the cloud's queue"),
        attempt=booking.attempt)
    # The pool's finalizer may go now: tell the finalizer loop rather than let it find out
    # at its next round.
    svc.state.pool_registry.pools_changed.set()
    return delay


async def _provider_changed(svc: Outcomes, req: RequestRecord, booking: Booking,
                            moved: list[str]) -> Delay:
    """A pool of the booking names another provider than the one whose queue holds the
    gang: cancel every group through the provider that queued it, then plan again."""
    what = "; ".join(moved)
    failures = await _cancel(svc, req, booking, why=what)
    if failures:
        poll = svc.config.acquisition.queue_poll_seconds
        since = req.annotations.get(QUEUED_SINCE_ANNOTATION) or rfc3339(svc.clock.now())
        await _write_queued(svc, req, since, (
            f"{what}, but the cloud refused to cancel the gang's queued request "
            f"({'; '.join(failures)}); Muster tries again every {poll:.0f}s"))
        return poll
    return await svc.retry_or_fail(
        req, attempt=booking.attempt, reason=Reason.ACQUISITION_FAILED,
        detail=f"{what} while the gang waited in the cloud's queue: the queued request was "
        "cancelled through the provider that queued it, and the gang is planned again")


async def _cancel(svc: Outcomes, req: RequestRecord, booking: Booking, *,
                  why: str, done: list[str] | None = None) -> list[str]:
    """Take every group out of the queue it was queued in (through the provider and
    parameters recorded then) and release whatever a grant created; the groups whose
    cancel failed, each with the cloud's error. ``done`` gets, per group cancelled, what
    its cloud did (a cloud that cannot cancel, as an AWS Capacity Block once bought, says
    what stays)."""
    pools = dict(svc.state.pool_registry.pools())
    failures: list[str] = []
    for group in booking.groups:
        found = _queued_through(svc, req, group)
        if found is None:
            continue
        pool, queue = found
        # What a grant created is released through the same provider and parameters.
        pools[group.pool] = pool
        try:
            did = await queue.cancel_queued(pool, group.key)
            if did is not None:
                log_decision("acquire", req.key, outcome="cancelled", pool=group.pool,
                       key=group.key, why=why)
            if done is not None:
                done.append(f"{group.key}: " + (
                    did or "nothing of it was held in the cloud's queue"))
        except ProviderError as exc:
            # The groups' keys stay on the request until the release below; what the cloud
            # grants afterwards carries an abandoned key the collector releases.
            log.warning("%s: cancelling the queued request of %s failed: %s", req.key,
                        group.key, exc)
            failures.append(f"{group.key} in pool {group.pool}: {exc}")
    await release_groups(
        booking.groups, pools=pools, provider_for=svc.providers.for_pool, owner=req.key,
        why=why, ledger=svc.state.ledger)
    return failures


async def leave(svc: Outcomes, req: RequestRecord) -> list[str]:
    """The request is being deleted before it was provisioned: cancel its queued requests
    and release what a grant may already have created. The cancels the cloud refused: the
    caller keeps the request's finalizer and tries again, since once the request is gone
    nothing would cancel them."""
    booking = req.booking
    if booking is None or req.phase is not Phase.ACQUIRING or not is_queued(svc, req):
        return []
    through = _through(req)
    if _queues(svc, req, booking) is None and not any(g.key in through for g in booking.groups):
        return []
    return await _cancel(svc, req, booking, why="the request is being deleted")


# --------------------------------------------------------------------------- Muster's own queue


async def wait(svc: Outcomes, req: RequestRecord, *, attempt: int, detail: str,
               relax_time: datetime | None = None) -> Delay:
    """A queued request found no capacity (no fit, or a stock-out at the cloud): wait for
    it without a retry limit, planned again when capacity may have freed or at the
    backoff's end."""
    svc.take(req, Event.WAITING)
    svc.state.ledger.unreserve(req.key)
    now = svc.clock.now()
    delay = svc.config.retry.backoff(attempt)
    if relax_time is not None:
        delay = max(0.0, min(delay, (relax_time - now).total_seconds()))
    retry_at = now + timedelta(seconds=delay)
    since = req.annotations.get(QUEUED_SINCE_ANNOTATION) or rfc3339(now)
    req = await svc.persist(req, annotations={
        ATTEMPT_ANNOTATION: str(attempt), RETRY_AT_ANNOTATION: rfc3339(retry_at),
        PHASE_ANNOTATION: None, PLAN_ANNOTATION: None, QUEUED_SINCE_ANNOTATION: since,
    })
    await _write_queued(svc, req, since, (
        f"no cloud queue serves the gang, so it waits in Muster's own: the plan is tried "
        f"again when a pool or node changes, at the latest at {rfc3339(retry_at)} "
        f"(attempt {attempt}); the last try: {detail.rstrip('.')}"))
    return delay


async def _write_queued(svc: Outcomes, req: RequestRecord, since: str,
                        detail: str) -> None:
    text = message(Reason.QUEUED_FOR_CAPACITY, since=since, detail=detail)
    await svc.write_status(req, [
        (ConditionType.ACCEPTED, True, Reason.ACCEPTED, message(Reason.ACCEPTED)),
        (ConditionType.PROVISIONED, False, Reason.QUEUED_FOR_CAPACITY, text)])


# --------------------------------------------------------------------------- run duration


def cloud_end(req: RequestRecord) -> datetime | None:
    """The earliest time a cloud that granted the request's queued gang takes the machines
    back whatever Muster does (recorded at the grant from the cloud's ``ends``), or None."""
    ends = []
    for entry in _through(req).values():
        when = parse_time(str(entry.get("ends") or ""))
        if when is not None:
            ends.append(when if when.tzinfo else when.replace(tzinfo=UTC))
    return min(ends, default=None)


def run_bound(booked: datetime | None, seconds: int | None,
              cloud: datetime | None) -> tuple[datetime, bool] | None:
    """When a run provisioned at ``booked`` ends, and whether the cloud's own end
    (``cloud``) is what ends it: ``seconds`` (maxRunDurationSeconds) after ``booked``, or
    earlier where the cloud takes the capacity back first. None when nothing bounds it."""
    if booked is None:
        return None
    end = None
    if seconds is not None:
        try:
            end = booked + timedelta(seconds=seconds)
        except OverflowError:
            end = None
    if cloud is not None and (end is None or cloud < end):
        return cloud, True
    return None if end is None else (end, False)


def run_end(svc: Outcomes, req: RequestRecord) -> datetime | None:
    """When the request's run ends (:func:`run_bound`), or None."""
    bound = run_bound(req.booked_at, run_seconds(svc, req), cloud_end(req))
    return None if bound is None else bound[0]


async def expire_run(svc: Outcomes, req: RequestRecord) -> tuple[bool, Delay]:
    """End a provisioned request whose run duration is over: CapacityRevoked first (the
    outcome), then every new node of the booking released, then the phase. (True, None)
    when it did or had; (False, seconds left) while the run lasts; (False, None) when the
    request has no run bound or its booking ended another way (its nodes already went)."""
    booking = req.booking
    bound = run_bound(req.booked_at, run_seconds(svc, req), cloud_end(req))
    if booking is None or bound is None:
        return False, None
    end, by_cloud = bound
    ended = req.ended_condition
    revoked = req.condition(ConditionType.CAPACITY_REVOKED) or {}
    mine = revoked.get("status") == "True" and revoked.get("reason") == Reason.RUN_DURATION_EXPIRED
    if ended is not None and not mine and ended.get("reason") != Reason.BOOKING_CONSUMED:
        return False, None
    now = svc.clock.now()
    if not mine:
        if now < end:
            return False, (end - now).total_seconds()
        # A consumed booking is already Ended: its run bound still takes the nodes back.
        svc.take(req, Event.ENDED if req.phase is Phase.BOOKED else Event.REPAIRED)
        seconds = run_seconds(svc, req)
        log_decision("end", req.key, condition=ConditionType.CAPACITY_REVOKED.value,
               reason=Reason.RUN_DURATION_EXPIRED.value, run_seconds=seconds)
        why = ("the cloud takes the granted capacity back then (an AWS Capacity Block's "
               "instances are terminated from 30 minutes before its end), before "
               + ("maxRunDurationSeconds" if seconds is not None else "any run bound")
               if by_cloud else
               f"{seconds}s after the capacity was provisioned, maxRunDurationSeconds")
        req = await svc.write_status(req, [(
            ConditionType.CAPACITY_REVOKED, True, Reason.RUN_DURATION_EXPIRED,
            message(Reason.RUN_DURATION_EXPIRED, end=rfc3339(end), why=why))])
    elif req.annotated_phase is Phase.ENDED:
        return True, None
    else:
        svc.take(req, Event.REPAIRED)
    if booking.groups:
        await release_groups(
            booking.groups, pools=svc.state.pool_registry.pools(),
            provider_for=svc.providers.for_pool,
            owner=req.key, why="the run duration (maxRunDurationSeconds) ended",
            ledger=svc.state.ledger)
    svc.state.ledger.unreserve(req.key)
    await svc.persist(req, annotations={PHASE_ANNOTATION: Phase.ENDED})
    return True, None
