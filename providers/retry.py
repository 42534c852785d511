"""Cross-cutting retries for cloud calls: throttling and 5xx, with full-jitter backoff.

Providers classify their SDK's exceptions (``is_transient``); this module only decides
how long to keep trying. When the budget is spent the last error is wrapped in
:class:`~providers.base.TransientProviderError`, so the controller sees one error type for
"the cloud is busy, try later" whatever the provider.

Blocking SDKs (boto3, google-cloud-compute) run in worker threads through
:class:`BlockingCalls`, which bounds how many calls are in flight at once so a burst of
gangs cannot exhaust the API rate limit or the default thread pool. :class:`CloudCalls`
puts the two together with the provider's error mapping: the one way a provider calls its SDK.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from providers.base import ProviderError, TransientProviderError

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")
K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 6
    """Total tries, the first one included."""
    initial_backoff: float = 0.5
    """Scale of the exponential backoff in seconds; each wait is uniform in [0, scale*2^n]."""
    max_backoff: float = 20.0
    deadline_seconds: float = 120.0
    """Stop retrying once this much time has passed since the first try."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be >= 1")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.deadline_seconds < 0:
            raise ValueError("backoff and deadline must be >= 0")


async def call_with_retry(
    fn: Callable[[], Awaitable[T]],
    *,
    is_transient: Callable[[BaseException], bool],
    policy: RetryPolicy,
    what: str,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Await ``fn()`` until it succeeds, fails permanently, or the retry budget is spent.

    ``fn`` must be safe to repeat: callers pass idempotency tokens that stay the same
    across tries (that is what makes retrying a launch call safe at all).
    """

    def _log(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        log.warning("%s: transient error on try %d, retrying: %s", what, state.attempt_number, exc)

    retrying = AsyncRetrying(
        stop=stop_after_attempt(policy.attempts) | stop_after_delay(policy.deadline_seconds),
        wait=wait_random_exponential(multiplier=policy.initial_backoff, max=policy.max_backoff),
        retry=retry_if_exception(
            lambda exc: is_transient(exc) and not isinstance(exc, ProviderError)
        ),
        reraise=True,
        sleep=sleep,
        before_sleep=_log,
    )
    tries = 0
    try:
        async for attempt in retrying:
            with attempt:
                tries += 1
                return await fn()
    except ProviderError:
        raise
    except Exception as exc:
        if is_transient(exc):
            raise TransientProviderError(
                f"{what}: still failing after {tries} tries: {exc}"
            ) from exc
        raise
    raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover


class BlockingCalls:
    """Runs blocking SDK calls in threads, at most ``max_concurrency`` at a time."""

    def __init__(self, max_concurrency: int) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        self.max_concurrency = max_concurrency
        self._semaphore = asyncio.Semaphore(max_concurrency)

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        async with self._semaphore:
            return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))


class CloudCalls(Generic[K]):
    """Blocking SDK calls in bounded worker threads, retried while transient, with every
    other failure mapped to a provider error.

    The provider supplies its SDK's rules: ``is_transient`` (worth retrying),
    ``map_error`` (SDK exception -> :class:`~providers.base.ProviderError`) and
    ``expected`` (the value to return instead of raising when a call's error code, of type
    ``K``, is one the caller listed in ``expect``; ``None`` when it is not).
    """

    def __init__(
        self,
        *,
        max_concurrency: int,
        policy: RetryPolicy,
        is_transient: Callable[[BaseException], bool],
        map_error: Callable[[BaseException, str], ProviderError],
        expected: Callable[[BaseException, Collection[K]], object | None],
    ) -> None:
        self._blocking = BlockingCalls(max_concurrency)
        self._policy = policy
        self._is_transient = is_transient
        self._map_error = map_error
        self._expected = expected

    async def once(self, fn: Callable[..., T], /, *args: Any, what: str) -> T:
        """One try in a worker thread, any failure mapped to a provider error (building a
        client: a retry would not help, a bad region or endpoint is a config error)."""
        try:
            return await self._blocking.run(fn, *args)
        except Exception as exc:
            raise self._map_error(exc, what) from exc

    async def call(
        self,
        fn: Callable[..., Any],
        /,
        *,
        what: str,
        expect: Collection[K] = (),
        **kwargs: Any,
    ) -> Any:
        """Call ``fn(**kwargs)`` in a worker thread with retries; map failures to provider
        errors, except error codes in ``expect``, returned as the provider's ``expected``
        value for the caller to handle."""

        async def try_once() -> Any:
            return await self._blocking.run(fn, **kwargs)

        try:
            return await call_with_retry(
                try_once, is_transient=self._is_transient, policy=self._policy, what=what
            )
        except ProviderError:
            raise
        except Exception as exc:
            handled = self._expected(exc, expect)
            if handled is not None:
                return handled
            raise self._map_error(exc, what) from exc
