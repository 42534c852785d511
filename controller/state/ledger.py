"""The booking ledger: what capacity is spoken for, and what is being given back. Pure.

:class:`BookingLedger` holds every live booking (persisted on its request, or reserved in
memory while a plan is being persisted), the acquisition keys whose nodes are being released
or were released while the cache may still hold them, and the pools an acquisition runs
through. :class:`controller.state.cache.ClusterState` owns one (``state.ledger``) and
subtracts its bookings from the snapshot it hands the fit engine; the reconcile, the
acquisition skeleton and the collector change it only through its methods, never by holding
its sets.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from controller.state.bookings import Booking


class BookingLedger:
    def __init__(self) -> None:
        self._persisted: dict[str, Booking] = {}
        """Bookings decoded from their request's ``muster.dev/plan`` (active phases only)."""
        self._reserved: dict[str, Booking] = {}
        """Bookings held in memory from the planner's pass until their request is written."""
        self._releasing: set[str] = set()
        """Acquisition keys whose nodes are being deleted: offered to no plan."""
        self._released: set[str] = set()
        """Keys whose release returned while the cache may still hold their nodes (the
        node watch reports the deletions later, later still through a cut watch): offered
        to no plan until the cache holds none of them."""
        self._acquiring: dict[str, int] = {}
        """Pool -> acquisitions running through it (their nodes may not be in the cache yet)."""

    # ------------------------------------------------------------------ bookings

    def record(self, key: str, booking: Booking | None) -> None:
        """The booking ``key``'s request persists now (None: none, or not an active one)."""
        if booking is None:
            self._persisted.pop(key, None)
        else:
            self._persisted[key] = booking

    def persisted(self, key: str) -> bool:
        return key in self._persisted

    def persisted_keys(self) -> list[str]:
        return list(self._persisted)

    def holds(self, key: str) -> bool:
        """A booking, persisted or reserved, is held for ``key``."""
        return key in self._persisted or key in self._reserved

    def drop(self, key: str) -> bool:
        """Forget ``key``'s bookings (its request is gone); whether it held one."""
        booked = self._persisted.pop(key, None) is not None
        return self._reserved.pop(key, None) is not None or booked

    def reserve(self, key: str, booking: Booking) -> None:
        """Hold ``booking`` in memory until :meth:`unreserve` (the plan is being persisted)."""
        self._reserved[key] = booking

    def unreserve(self, key: str) -> None:
        self._reserved.pop(key, None)

    def bookings(self) -> dict[str, Booking]:
        """Every active booking by request key (in-memory reservations win)."""
        return {**self._persisted, **self._reserved}

    # ------------------------------------------------------------------ releases

    def start_release(self, keys: Iterable[str]) -> frozenset[str]:
        """Mark ``keys`` as being released; return those this call marked (a key another
        release already holds stays that release's to clear)."""
        mine = frozenset(keys) - self._releasing
        self._releasing |= mine
        return mine

    def end_release(self, mine: Collection[str], released: Iterable[str]) -> None:
        """A release ended: clear the keys :meth:`start_release` gave this caller, and keep
        ``released`` from plans until the cache has seen their nodes go."""
        self._releasing -= set(mine)
        self._released |= set(released)

    def releasing(self, key: str) -> bool:
        return key in self._releasing

    def releasing_keys(self) -> frozenset[str]:
        return frozenset(self._releasing)

    def released_keys(self) -> frozenset[str]:
        return frozenset(self._released)

    def forget_released(self, keys: Iterable[str]) -> None:
        """``keys`` are no longer released ones: their nodes are gone from the cache, or a
        resumed attempt acquires them anew."""
        self._released -= set(keys)

    # ------------------------------------------------------------------ acquisitions

    def begin_acquiring(self, pools: Iterable[str]) -> None:
        """An acquisition through ``pools`` starts: from before the pools are held until
        :meth:`end_acquiring`, once its nodes are in the cache or released."""
        for name in set(pools):
            self._acquiring[name] = self._acquiring.get(name, 0) + 1

    def end_acquiring(self, pools: Iterable[str]) -> None:
        for name in set(pools):
            left = self._acquiring.get(name, 0) - 1
            if left > 0:
                self._acquiring[name] = left
            else:
                self._acquiring.pop(name, None)

    def acquiring(self, pool: str) -> bool:
        """An acquisition through ``pool`` runs."""
        return self._acquiring.get(pool, 0) > 0
