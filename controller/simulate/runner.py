"""Run several strategies on one trace and one seed, in a fixed order."""

from __future__ import annotations

from collections.abc import Sequence

from controller.simulate.engine import SimConfig
from controller.simulate.metrics import StrategyResult
from controller.simulate.strategies import STRATEGIES, Planner, make
from controller.simulate.trace import Trace


def run_strategies(
    trace: Trace,
    config: SimConfig,
    strategies: Sequence[str] = STRATEGIES,
    planner: Planner | None = None,
) -> list[StrategyResult]:
    """Each strategy replays ``trace`` from scratch with the same seed."""
    config.validate()
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(
            f"unknown strateg{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; "
            f"choose from {', '.join(STRATEGIES)}"
        )
    return [make(name, trace, config, planner).run() for name in strategies]
