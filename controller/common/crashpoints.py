"""Test-only crash points: ``MUSTER_CRASH_AT=<step>:<nth>`` kills the process (SIGKILL, as
the kernel or a node loss would) the ``nth`` time it reaches ``<step>``.

The crash harness (:mod:`e2e.chaos`) sets the variable on the ``muster run`` processes it
starts, to cut the acquisition path exactly where a crash is hardest to repair. Unset (always,
outside that harness) :func:`reached` is one comparison against None: nothing else runs.
Several steps may be named, comma-separated (``plan-persisted:2,mid-release:1``).

Steps, in the order a request meets them:

* ``plan-persisted``: the plan, keys and phase Acquiring are written; no provider call yet;
* ``mid-acquisition``: one node of an acquisition created, the others not (fake provider);
* ``acquired``: every group acquired, nodes not yet Ready, Provisioned=True not written;
* ``before-confirm``: nodes Ready, just before the status write that makes the booking;
* ``outcome-written``: Failed / BookingExpired / CapacityRevoked written, annotations and
  the release of unused nodes not yet done;
* ``mid-release``: one node of a group deleted, the others not (fake provider).
"""

from __future__ import annotations

import os
import signal

ENV = "MUSTER_CRASH_AT"
STEPS = (
    "plan-persisted", "mid-acquisition", "acquired", "before-confirm", "outcome-written",
    "mid-release",
)


def _parse(text: str | None) -> dict[str, int] | None:
    if not text:
        return None
    targets: dict[str, int] = {}
    for part in text.split(","):
        step, _, nth = part.strip().partition(":")
        if step not in STEPS:
            raise ValueError(f"{ENV}: unknown step {step!r} (known: {', '.join(STEPS)})")
        try:
            count = int(nth or "1")
        except ValueError:
            raise ValueError(f"{ENV}: {part!r} is not <step>:<nth>") from None
        if count < 1:
            raise ValueError(f"{ENV}: {part!r}: nth must be >= 1")
        targets[step] = count
    return targets


_targets = _parse(os.environ.get(ENV))
_seen: dict[str, int] = {}


def reached(step: str) -> None:
    """Die here if ``MUSTER_CRASH_AT`` names ``step`` and this is its ``nth`` passage."""
    if _targets is None:
        return
    _hit(step)


def _hit(step: str) -> None:
    nth = _targets.get(step) if _targets else None
    if nth is None:
        return
    _seen[step] = _seen.get(step, 0) + 1
    if _seen[step] == nth:
        # Flushed so the harness can tell a planned crash from a bug.
        print(f"muster: crash point {step}:{nth} reached, SIGKILL", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def configure(text: str | None) -> None:
    """Re-read the targets (tests); ``None`` switches every crash point off."""
    global _targets
    _targets = _parse(text)
    _seen.clear()
