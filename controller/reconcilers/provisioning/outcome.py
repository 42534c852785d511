"""Outcomes of an attempt that did not book: retry after a backoff, or Failed (status first,
then the annotations cleaned), and the repair of a Failed request a crash cut short.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from controller.api.parameters import NO_RETRY, VALID_UNTIL_SECONDS, Parameters
from controller.common import crashpoints
from controller.common.conditions import ConditionType, Reason, message, rfc3339
from controller.common.decision_log import log_decision
from controller.lifecycle import (
    ATTEMPT_ANNOTATION,
    PHASE_ANNOTATION,
    PLAN_ANNOTATION,
    RETRY_AT_ANNOTATION,
    UNREADY_ANNOTATION,
    Event,
    Phase,
)
from controller.reconcilers import queued
from controller.reconcilers.provisioning.base import Delay, StepsBase, _accepted
from controller.state.requests import RequestRecord


class Outcomes(StepsBase):
    """Retry or fail."""

    def valid_until(self, req: RequestRecord, params: Parameters) -> datetime | None:
        """Creation + ValidUntilSeconds: no attempt starts after it."""
        created = req.created_at
        seconds = params.values.valid_until_seconds
        if seconds is None or created is None:
            return None
        try:
            return created + timedelta(seconds=seconds)
        except OverflowError:
            # Past the last representable date (up to 255 digits are valid): no deadline.
            return None

    async def retry_or_fail(
        self,
        req: RequestRecord,
        *,
        attempt: int,
        reason: Reason,
        detail: str,
        permanent: bool = False,
        relax_time: datetime | None = None,
        ready_within: float | None = None,
    ) -> Delay:
        """``relax_time``: when the request's topology may be relaxed; the next attempt is
        then no later than that. ``ready_within``: the registration budget nodes that were
        not Ready were given (NodesNotReady)."""
        ready_within = ready_within or self.config.acquisition.node_ready_timeout_seconds
        self.state.ledger.unreserve(req.key)
        if (not permanent and reason is Reason.CAPACITY_IS_NOT_FOUND
                and queued.is_queued(self, req)):
            return await queued.wait(self, req, attempt=attempt, detail=detail,
                                     relax_time=relax_time)
        max_attempts = self.config.retry.max_attempts
        params = self.parameters(req)
        if not permanent and params.values.no_retry:
            what = ("Capacity is not found" if reason is Reason.CAPACITY_IS_NOT_FOUND
                    else f"Attempt {attempt} failed ({reason.value})")
            return await self.fail(
                req, reason, f"{what}: {detail}. {NO_RETRY} is set, so Muster does not retry.",
                attempt=attempt,
            )
        delay = self.config.retry.backoff(attempt)
        if relax_time is not None:
            delay = max(0.0, min(delay, (relax_time - self.clock.now()).total_seconds()))
        deadline = self.valid_until(req, params)
        if (not permanent and attempt < max_attempts and deadline is not None
                and self.clock.now() + timedelta(seconds=delay) > deadline):
            return await self.fail(
                req, Reason.RETRIES_EXHAUSTED,
                f"Capacity is not found within {VALID_UNTIL_SECONDS}="
                f"{params.values.valid_until_seconds} of the request's creation ({attempt} "
                f"attempt(s); the next would start after {rfc3339(deadline)}): {detail}. "
                "Free capacity or add stock, then recreate the request, or allow it longer.",
                attempt=attempt,
            )
        unready = req.unready_acquisitions + (reason is Reason.NODES_NOT_READY)
        limit = self.config.retry.max_unready_acquisitions
        if not permanent and reason is Reason.NODES_NOT_READY and unready >= limit:
            return await self.fail(
                req, Reason.RETRIES_EXHAUSTED,
                f"{unready} acquisition(s) gave nodes that were not Ready within "
                f"{ready_within:.0f}s "
                f"(retry.max_unready_acquisitions {limit}; each was paid for, then released): "
                f"{detail}. Check the pool's node image and bootstrap, then recreate the "
                "request.",
                attempt=attempt,
            )
        if permanent or attempt >= max_attempts:
            final = Reason.RETRIES_EXHAUSTED if not permanent else reason
            text = (
                message(Reason.RETRIES_EXHAUSTED, attempts=attempt, detail=detail)
                if not permanent
                else f"{reason.value}: {detail}. Not retryable; fix the pool or provider."
            )
            return await self.fail(req, final, text, attempt=attempt)
        retry_at = self.clock.now() + timedelta(seconds=delay)
        self.take(req, Event.RETRY)
        req = await self.persist(
            req,
            annotations={
                ATTEMPT_ANNOTATION: str(attempt),
                UNREADY_ANNOTATION: str(unready) if unready else None,
                RETRY_AT_ANNOTATION: rfc3339(retry_at),
                PHASE_ANNOTATION: None,
                PLAN_ANNOTATION: None,
            },
        )
        fields = {"detail": detail, "attempt": attempt, "max_attempts": max_attempts,
                  "delay": delay}
        text = (
            message(Reason.ACQUISITION_FAILED, **fields)
            if reason is Reason.ACQUISITION_FAILED
            else message(reason, **fields)
            if reason in (Reason.CAPACITY_IS_NOT_FOUND, Reason.NAMESPACE_LIMIT_REACHED,
                          Reason.POOL_UNUSABLE)
            else message(reason, seconds=ready_within,
                         detail=detail)
        )
        await self.write_status(
            req, [_accepted(), (ConditionType.PROVISIONED, False, reason, text)]
        )
        return delay

    async def fail(
        self, req: RequestRecord, reason: Reason, text: str, *, attempt: int | None = None
    ) -> Delay:
        """Failed=True first: it is the outcome and decides the phase. The annotations are
        then only cleaned up (plan dropped, so the cache stops holding it), and only when
        there is something to clean: a request failed before any plan costs one write."""
        self.take(req, Event.FAILED)
        self.state.ledger.unreserve(req.key)
        if not req.condition_true(ConditionType.FAILED):
            log_decision("fail", req.key, reason=reason.value, attempt=attempt, message=text)
        req = await self.write_status(
            req,
            [_accepted(), (ConditionType.PROVISIONED, False, reason, text),
             (ConditionType.FAILED, True, reason, text)],
        )
        crashpoints.reached("outcome-written")
        return await self._clean_failed(req, attempt=attempt)

    async def _clean_failed(self, req: RequestRecord, *, attempt: int | None = None) -> Delay:
        held = req.annotations
        if (PLAN_ANNOTATION in held or RETRY_AT_ANNOTATION in held
                or (PHASE_ANNOTATION in held and req.annotated_phase is not Phase.FAILED)):
            annotations: dict[str, str | None] = {
                PHASE_ANNOTATION: Phase.FAILED,
                PLAN_ANNOTATION: None,
                RETRY_AT_ANNOTATION: None,
            }
            if attempt is not None:
                annotations[ATTEMPT_ANNOTATION] = str(attempt)
            await self.persist(req, annotations=annotations)
        return None

    async def repair_failed(self, req: RequestRecord) -> Delay:
        """A failed request: finish what a crash or a failed write left undone."""
        self.take(req, Event.REPAIRED)
        self.state.ledger.unreserve(req.key)
        if not req.condition_true(ConditionType.FAILED):
            # Phase Failed written by an earlier Muster, which wrote the status second and
            # lost it: the reason is gone, so say what is known.
            last = req.condition(ConditionType.PROVISIONED) or {}
            try:
                reason = Reason(str(last.get("reason") or ""))
            except ValueError:
                reason = Reason.RETRIES_EXHAUSTED
            text = (f"Muster failed this request, but a crash lost the reason; the last "
                    f"status said: {last.get('message') or 'nothing'}. Recreate the request.")
            req = await self.write_status(
                req, [_accepted(), (ConditionType.PROVISIONED, False, reason, text),
                      (ConditionType.FAILED, True, reason, text)],
            )
        return await self._clean_failed(req)
