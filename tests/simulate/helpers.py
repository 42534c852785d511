"""Hand-made traces and a deterministic cloud for the simulator tests."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from controller.simulate.cloud import CloudConfig
from controller.simulate.engine import SimConfig
from controller.simulate.trace import Job, Trace

ORIGIN = datetime(2017, 10, 1, tzinfo=UTC)
H = 3600.0


def trace(*jobs: tuple[float, float, int]) -> Trace:
    """Jobs as (submit seconds, duration seconds, GPUs), in submit order."""
    return Trace(
        jobs=tuple(
            Job(seq=i, submit=s, duration=d, gpus=g, cluster="c")
            for i, (s, d, g) in enumerate(jobs)
        ),
        origin=ORIGIN,
        source="hand-made",
    )


def config(**cloud: object) -> SimConfig:
    """Every node boots in exactly 100 s; stock never changes unless a test asks for it.

    Defaults: one block of two racks of 8 nodes, full stock, a quota far above the need.
    """
    base = CloudConfig(
        blocks=1,
        racks_per_block=2,
        nodes_per_rack=8,
        quota_gpus=1024,
        initial_stock=(8, 8),
        refill_prob=0.0,
        drain_prob=0.0,
        boot_min_s=100.0,
        boot_max_s=100.0,
    )
    return SimConfig(cloud=replace(base, **cloud), start_timeout_s=2 * H)  # type: ignore[arg-type]
