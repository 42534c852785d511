"""The simulated cloud: one pool of identical GPU nodes spread over racks grouped in blocks.

What it models, all seeded:

* **Stock per rack.** A rack has ``nodes_per_rack`` slots; other tenants hold some of them, the
  simulated cluster holds some, the rest is stock that anyone can acquire. Every
  ``refill_interval_s`` each rack's other tenants release one node with probability
  ``refill_prob`` and take one with probability ``drain_prob``, so stock runs out and refills
  over time. A node the cluster releases goes back to its rack's stock.
* **Quota.** The cluster never holds more than ``quota_gpus`` GPUs (booting nodes count).
* **Acquisition.** An atomic request (Muster) gets every node it asked for in the racks it
  named, or nothing. A non-atomic request (cluster-autoscaler's ``IncreaseSize``) gets what is in
  stock within the quota: asking for 12 when 7 are there yields 7, landing in whichever racks
  have stock (visited in a seeded random order, as a cloud's placement is opaque).
* **Boot latency.** Each node is ready a seeded uniform ``[boot_min_s, boot_max_s]`` after the
  request; it is paid from the request on.

Random streams are separate (stock, boot, placement) so that the other tenants behave the same
whatever the strategy does: their draws happen on every tick for every rack, used or not.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CloudConfig:
    blocks: int = 4
    racks_per_block: int = 4
    nodes_per_rack: int = 8
    gpus_per_node: int = 8
    quota_gpus: int = 512
    initial_stock_min: int = 2
    """Each rack starts with a seeded uniform stock in [initial_stock_min, nodes_per_rack]."""
    initial_stock: tuple[int, ...] | None = None
    """Explicit starting stock per rack (block-major order); overrides the random draw."""
    refill_interval_s: float = 1800.0
    refill_prob: float = 0.5
    drain_prob: float = 0.3
    boot_min_s: float = 90.0
    boot_max_s: float = 120.0

    def validate(self) -> None:
        """Raise ValueError naming the first setting that makes no sense."""
        checks: list[tuple[bool, str]] = [
            (self.blocks >= 1, f"blocks must be >= 1, got {self.blocks}"),
            (
                self.racks_per_block >= 1,
                f"racks per block must be >= 1, got {self.racks_per_block}",
            ),
            (self.nodes_per_rack >= 1, f"nodes per rack must be >= 1, got {self.nodes_per_rack}"),
            (self.gpus_per_node >= 1, f"GPUs per node must be >= 1, got {self.gpus_per_node}"),
            (self.quota_gpus >= 0, f"quota must be >= 0 GPUs, got {self.quota_gpus}"),
            (
                0 <= self.initial_stock_min <= self.nodes_per_rack,
                f"initial stock min must be in [0, {self.nodes_per_rack}], "
                f"got {self.initial_stock_min}",
            ),
            (self.refill_interval_s > 0, "refill interval must be > 0 seconds"),
            (0.0 <= self.refill_prob <= 1.0, "refill probability must be in [0, 1]"),
            (0.0 <= self.drain_prob <= 1.0, "drain probability must be in [0, 1]"),
            (
                0.0 <= self.boot_min_s <= self.boot_max_s,
                f"boot latency needs 0 <= min <= max, got {self.boot_min_s}..{self.boot_max_s}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.initial_stock is not None:
            racks = self.blocks * self.racks_per_block
            if len(self.initial_stock) != racks:
                raise ValueError(
                    f"initial stock needs {racks} values, got {len(self.initial_stock)}"
                )
            if any(not 0 <= s <= self.nodes_per_rack for s in self.initial_stock):
                raise ValueError(f"initial stock values must be in [0, {self.nodes_per_rack}]")

    @property
    def racks(self) -> int:
        return self.blocks * self.racks_per_block

    @property
    def quota_nodes(self) -> int:
        return self.quota_gpus // self.gpus_per_node


class Cloud:
    """Stock, quota and boot latency of the simulated cloud (mutable, one per run)."""

    def __init__(self, config: CloudConfig, seed: int) -> None:
        config.validate()
        self.config = config
        racks = config.racks
        self.rack_block = [r // config.racks_per_block for r in range(racks)]
        if config.initial_stock is not None:
            stock = list(config.initial_stock)
        else:
            rng = random.Random(f"{seed}/stock")
            low, high = config.initial_stock_min, config.nodes_per_rack
            stock = [rng.randint(low, high) for _ in range(racks)]
        self.stock = stock
        self.ours = [0] * racks
        self.others = [config.nodes_per_rack - s for s in stock]
        self.held_nodes = 0
        self.version = 0
        """Bumped whenever stock or quota room changes, so callers can cache what they derive."""
        self._tenants = random.Random(f"{seed}/tenants")
        self._boot = random.Random(f"{seed}/boot")
        self._placement = random.Random(f"{seed}/placement")

    # ------------------------------------------------------------------ queries
    def quota_room_nodes(self) -> int:
        return max(0, self.config.quota_nodes - self.held_nodes)

    def total_stock(self) -> int:
        return sum(self.stock)

    # ------------------------------------------------------------------ acquisition
    def acquire_atomic(self, units: list[tuple[int, int]]) -> list[tuple[int, float]] | None:
        """Take ``count`` nodes in each ``(rack, count)`` unit, all or none.

        Returns ``(rack, boot_seconds)`` per node, or None (and changes nothing) when a rack's
        stock or the quota falls short.
        """
        need: dict[int, int] = {}
        for rack, count in units:
            need[rack] = need.get(rack, 0) + count
        total = sum(need.values())
        if total > self.quota_room_nodes():
            return None
        if any(self.stock[rack] < count for rack, count in need.items()):
            return None
        granted: list[tuple[int, float]] = []
        for rack, count in units:
            granted.extend(self._take(rack, count))
        return granted

    def acquire_any(self, count: int) -> list[tuple[int, float]]:
        """Take up to ``count`` nodes wherever there is stock, within the quota."""
        count = min(count, self.quota_room_nodes())
        if count <= 0:
            return []
        order = list(range(len(self.stock)))
        self._placement.shuffle(order)
        granted: list[tuple[int, float]] = []
        for rack in order:
            if count <= 0:
                break
            take = min(count, self.stock[rack])
            if take:
                granted.extend(self._take(rack, take))
                count -= take
        return granted

    def acquire_count_atomic(self, count: int) -> list[tuple[int, float]] | None:
        """Take ``count`` nodes wherever there is stock, all or none (a node group's
        ``AtomicIncreaseSize``: the cloud places them, the caller names no rack)."""
        if count > self.quota_room_nodes() or count > self.total_stock():
            return None
        return self.acquire_any(count)

    def _take(self, rack: int, count: int) -> list[tuple[int, float]]:
        cfg = self.config
        self.stock[rack] -= count
        self.ours[rack] += count
        self.held_nodes += count
        self.version += 1
        return [(rack, self._boot.uniform(cfg.boot_min_s, cfg.boot_max_s)) for _ in range(count)]

    def release(self, rack: int) -> None:
        if self.ours[rack] <= 0:
            raise RuntimeError(f"rack {rack}: releasing a node the cluster does not hold")
        self.ours[rack] -= 1
        self.stock[rack] += 1
        self.held_nodes -= 1
        self.version += 1

    # ------------------------------------------------------------------ other tenants
    def tick(self) -> bool:
        """One refill period of the other tenants; True when some rack gained stock."""
        cfg = self.config
        gained = changed = False
        for rack in range(len(self.stock)):
            frees = self._tenants.random() < cfg.refill_prob
            takes = self._tenants.random() < cfg.drain_prob
            if frees and self.others[rack] > 0:
                self.others[rack] -= 1
                self.stock[rack] += 1
                gained = changed = True
            if takes and self.stock[rack] > 0:
                self.stock[rack] -= 1
                self.others[rack] += 1
                changed = True
        if changed:
            self.version += 1
        return gained
