"""What the collector does with one acquisition group it found in a pool. Pure.

The collector (:mod:`controller.acquire.collector`) lists every pool through its provider,
groups the nodes by acquisition key and asks :func:`decide` about each group, handing in
what it knows (:class:`GroupView`) and what it remembered from earlier sweeps
(:class:`Seen`). The answer says whether to release the group now, and what to remember.

* A group is **held** while an acquisition under its key runs in this process, while any
  node of it is counted on by a live booking, or while the request whose plan records the
  key is ``Acquiring`` or ``Booked``. Held groups are never released.
* A group no request holds, on which no sweep saw a pod, is an **orphan**: an interrupted or
  failed attempt, or a request that is gone. It is released once it has been seen unheld
  for ``grace`` seconds. The grace covers the window in which the collector's view lags
  the API server: a plan persisted by a previous leader, or written a moment ago, that the
  watch-fed cache has not shown yet, while the provider already lists the nodes launched
  under it. Once the plan shows up the group is held and the count starts afresh.
* A group that was used (pods ran on it) or whose request's booking ended is released
  together once no pod has run on it for ``idle_ttl`` seconds; in a CapacityPool being
  deleted at once (nothing new is planned there, waiting buys nothing).

The memory is in-process: a restarted controller starts the grace and the idle TTL again,
which delays a release but never hastens one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from controller.lifecycle import Phase

HOLDING_PHASES = frozenset({Phase.ACQUIRING, Phase.BOOKED})


@dataclass(frozen=True, slots=True)
class GroupView:
    """What the collector knows about one group now."""

    in_flight: bool = False
    """An acquisition under this key runs in this process."""
    booked: bool = False
    """A node of the group is counted on by a live booking (possibly another request's)."""
    owner_known: bool = False
    """The request named in the nodes' owner uid exists."""
    holder: Phase | None = None
    """Phase of the owner request when its plan or booking records this key, else None."""
    in_use: bool = False
    """Pods run on the group's nodes now."""
    pool_deleting: bool = False


@dataclass(frozen=True, slots=True)
class Seen:
    """What earlier sweeps saw of one group."""

    unheld_since: datetime | None = None
    """When it was first seen as an orphan (held by nothing, never used)."""
    idle_since: datetime | None = None
    """When it was first seen without pods after it had been used or its booking ended."""
    used: bool = False
    """Pods ran on it at some sweep."""


@dataclass(frozen=True, slots=True)
class Decision:
    release: bool
    why: str
    """Why it is released, or why it stays (for logs)."""
    seen: Seen
    """What to remember for the next sweep."""


def decide(
    view: GroupView, seen: Seen, *, now: datetime, grace: float, idle_ttl: float
) -> Decision:
    """Release the group now, or keep it (and remember what for)."""
    if grace < 0 or idle_ttl < 0:
        raise ValueError("grace and idle_ttl must be >= 0")
    if view.in_flight or view.booked or view.holder in HOLDING_PHASES:
        return Decision(False, "held", Seen(used=seen.used))
    if view.in_use:
        return Decision(False, "pods run on it", Seen(used=True))
    if not seen.used and view.holder is not Phase.ENDED:
        since = seen.unheld_since or now
        waited = (now - since).total_seconds()
        if waited < grace:
            return Decision(False, f"orphan, released in {grace - waited:.0f}s",
                            replace(seen, unheld_since=since))
        # What the collector knows of its use is what its sweeps saw (pods of other
        # requests may have come and gone between two sweeps, or before a restart): say
        # that, not that no pod ever ran on it.
        unused = "no pod runs on it, nor did at any sweep since this Muster started"
        if not view.owner_known:
            why = f"its request is gone and {unused}"
        else:
            why = f"no booking holds it (an interrupted or failed attempt) and {unused}"
        return Decision(True, f"{why} (unheld for {waited:.0f}s)", Seen())
    if view.pool_deleting:
        return Decision(True, "its CapacityPool is being deleted and no booking or pod uses it",
                        Seen())
    since = seen.idle_since or now
    idle = (now - since).total_seconds()
    if idle >= idle_ttl:
        return Decision(True, f"its pods are gone and it was idle for {idle:.0f}s", Seen())
    return Decision(False, f"idle for {idle:.0f}s", Seen(idle_since=since, used=seen.used))
