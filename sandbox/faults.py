"""Fault injection for the sandbox's HTTP API, switchable at runtime by tests.

Faults apply to HTTP requests only (the in-process ``Store`` API used to set up fixtures is
never disturbed). Every random draw comes from one seeded ``random.Random``, so a test that sets
a seed and issues the same requests sees the same faults.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
ALL_VERBS = frozenset({"get", "list", "watch", *WRITE_VERBS})


@dataclass
class Rule:
    """One fault: applies to requests whose verb and resource match (empty set = any).

    A resource names a subresource as RBAC does (``provisioningrequests/status``); the bare
    plural matches the resource and all its subresources. ``times`` limits the rule to the
    first N requests it matches (a proxy failing one write, then healthy again)."""

    kind: str  # "latency" | "error" | "conflict"
    probability: float = 1.0
    seconds: float = 0.0
    status: int = 500
    verbs: frozenset[str] = frozenset()
    resources: frozenset[str] = frozenset()
    times: int | None = None

    def applies(self, verb: str, resource: str, group: str, subresource: str | None = None) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.verbs and verb not in self.verbs:
            return False
        if self.resources:
            qualified = f"{resource}.{group}" if group else resource
            names = {resource, qualified}
            if subresource:
                names |= {f"{resource}/{subresource}", f"{qualified}/{subresource}"}
            if not names & self.resources:
                return False
        return True


def _set(values: Iterable[str] | str | None) -> frozenset[str]:
    if values is None:
        return frozenset()
    if isinstance(values, str):
        return frozenset([values])
    return frozenset(values)


@dataclass
class Faults:
    """The fault switches. Resources are plurals (``pods``) or ``plural.group`` names."""

    seed: int | None = None
    rules: list[Rule] = field(default_factory=list)
    drop_watch_every: int = 0
    drop_watch_resources: frozenset[str] = frozenset()
    injected: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._close_watches: list[tuple[frozenset[str], int]] = []
        self.closer: Callable[[frozenset[str]], int] | None = None

    def reseed(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)

    def clear(self) -> None:
        """Switch every fault off."""
        self.rules.clear()
        self.drop_watch_every = 0
        self.drop_watch_resources = frozenset()

    def _check_probability(self, p: float) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"probability must be within [0, 1], got {p}")

    def add_latency(
        self, seconds: float, *, verbs: Iterable[str] | str | None = None,
        resources: Iterable[str] | str | None = None, probability: float = 1.0,
    ) -> Rule:
        """Delay matching requests by ``seconds`` before they are served."""
        if seconds < 0:
            raise ValueError("latency must not be negative")
        self._check_probability(probability)
        rule = Rule("latency", probability, seconds=seconds, verbs=self._verbs(verbs),
                    resources=_set(resources))
        self.rules.append(rule)
        return rule

    def add_errors(
        self, probability: float, *, status: int = 500,
        verbs: Iterable[str] | str | None = None,
        resources: Iterable[str] | str | None = None,
        times: int | None = None,
    ) -> Rule:
        """Answer matching requests with HTTP ``status`` (5xx or 429) with this probability
        (only the first ``times`` of them, when given)."""
        self._check_probability(probability)
        if not (500 <= status <= 599 or status == 429):
            raise ValueError(f"error faults must be 5xx or 429, got {status}")
        if times is not None and times < 1:
            raise ValueError(f"times must be >= 1, got {times}")
        rule = Rule("error", probability, status=status, verbs=self._verbs(verbs),
                    resources=_set(resources), times=times)
        self.rules.append(rule)
        return rule

    def add_conflicts(
        self, probability: float, *, verbs: Iterable[str] | str | None = None,
        resources: Iterable[str] | str | None = None, times: int | None = None,
    ) -> Rule:
        """Conflict storm: matching writes fail with 409 Conflict with this probability
        (only the first ``times`` of them, when given)."""
        self._check_probability(probability)
        if times is not None and times < 1:
            raise ValueError(f"times must be >= 1, got {times}")
        chosen = self._verbs(verbs) or WRITE_VERBS
        rule = Rule("conflict", probability, verbs=chosen & WRITE_VERBS,
                    resources=_set(resources), times=times)
        self.rules.append(rule)
        return rule

    def drop_watches_every(
        self, n: int, *, resources: Iterable[str] | str | None = None,
    ) -> None:
        """End every watch stream after it has delivered ``n`` events (0 switches it off)."""
        if n < 0:
            raise ValueError("n must be >= 0")
        self.drop_watch_every = n
        self.drop_watch_resources = _set(resources)

    def close_watches(self, resources: Iterable[str] | str | None = None) -> int:
        """End the watch streams open now; returns how many were closed."""
        if self.closer is None:
            return 0
        return self.closer(_set(resources))

    def remove(self, rule: Rule) -> None:
        if rule in self.rules:
            self.rules.remove(rule)

    @staticmethod
    def _verbs(verbs: Iterable[str] | str | None) -> frozenset[str]:
        chosen = _set(verbs)
        unknown = chosen - ALL_VERBS
        if unknown:
            raise ValueError(f"unknown verbs {sorted(unknown)}; known: {sorted(ALL_VERBS)}")
        return chosen

    def draw(self, rule: Rule) -> bool:
        hit = rule.probability >= 1.0 or self.rng.random() < rule.probability
        if hit and rule.times is not None:
            rule.times -= 1
        return hit

    def watch_drop_applies(self, resource: str, group: str) -> int:
        if not self.drop_watch_every:
            return 0
        if self.drop_watch_resources:
            qualified = f"{resource}.{group}" if group else resource
            if not ({resource, qualified} & self.drop_watch_resources):
                return 0
        return self.drop_watch_every

