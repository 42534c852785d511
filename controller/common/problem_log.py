"""Each problem logged once per interval, not per attempt (see
:mod:`controller.runtime.problems`)."""

from __future__ import annotations

import logging
import time

LOG_INTERVAL = 30.0
"""A problem seen again within this many seconds is counted, not logged."""


class ProblemLog:
    """Logs a problem (a key: where and what) at most once per ``interval`` seconds; the
    next line says how many times it came back meanwhile, and :meth:`resolved` says when it
    went away."""

    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL) -> None:
        self._log = logger
        self.interval = interval
        self._seen: dict[str, list[float]] = {}
        """key -> [when last logged, times seen since, resolution said]"""

    def warning(self, key: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.interval:
            # Also after a success in between: a problem that flaps (a 5xx storm answering
            # every third request) is still one problem per interval.
            seen[1] += 1
            return
        if seen is not None and seen[1]:
            msg += " (%d more time(s) in the last %.0fs)"
            args = (*args, int(seen[1]), now - seen[0])
        self._log.warning(msg, *args)
        if len(self._seen) > 1024:  # keys are few (where x what); never let them pile up
            self._seen.clear()
        self._seen[key] = [now, 0, 0]

    def resolved(self, key: str, msg: str | None = None, *args: object) -> None:
        """The problem is over: log ``msg`` once (if the problem had been logged). It is
        remembered until its interval ends, so that it coming back soon is counted."""
        seen = self._seen.get(key)
        if seen is None:
            return
        if time.monotonic() - seen[0] >= self.interval:
            del self._seen[key]
        if not seen[2]:
            seen[2] = 1
            if msg:
                self._log.info(msg, *args)
