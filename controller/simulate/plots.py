"""Charts of ``muster simulate``: the only module that imports matplotlib (imported lazily,
so the simulator runs without it when no chart is asked for)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controller.simulate.engine import SimConfig
    from controller.simulate.metrics import StrategyResult
    from controller.simulate.sweep import SweepPoint
    from controller.simulate.trace import Trace


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def timeline(
    results: Sequence[StrategyResult], trace: Trace, config: SimConfig, path: Path
) -> None:
    """Paid and used GPUs over time, one panel per strategy (averaged per bin)."""
    from controller.simulate.report import title

    plt = _pyplot()
    fig, axes = plt.subplots(
        len(results), 1, figsize=(11, 2.6 * len(results) + 0.6), sharex=True, squeeze=False
    )
    for ax, r in zip(axes[:, 0], results, strict=True):
        days = [i * r.series_bin_s / 86400.0 for i in range(len(r.series_paid))]
        ax.fill_between(days, r.series_paid, step="post", alpha=0.35, label="paid", color="tab:red")
        ax.step(days, r.series_used, where="post", label="used by running jobs", color="tab:blue")
        ax.set_ylabel("GPUs")
        ax.set_title(
            f"{r.strategy}: paid {r.paid_gpu_h:,.0f} GPU-h, used {r.used_gpu_h:,.0f}, "
            f"stranded {r.stranded_gpu_h:,.0f}",
            fontsize=10,
            loc="left",
        )
        ax.axhline(config.cloud.quota_gpus, color="grey", linestyle=":", linewidth=1)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel(f"days since {trace.origin:%Y-%m-%d %H:%M} UTC")
    fig.suptitle(title(trace, config), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# (metric key of SweepPoint.metrics, axis label)
SWEEP_METRICS = (
    ("paid_gpu_h", "GPU-hours paid\n(the cost)"),
    ("stranded_gpu_h", "GPU-hours stranded\n(paid - used)"),
    ("gang_wait_p95_h", "gang wait p95 (h)"),
    ("never_started", "jobs never started"),
    ("gangs_cross_block", "gangs across blocks"),
    ("gangs_deadlocked", "gangs deadlocked"),
)
_STYLE = {
    "muster": ("tab:green", "o", "-"),
    "muster-relax": ("tab:olive", "s", "--"),
    "muster-retry": ("tab:cyan", "P", "-"),
    "muster-shipped": ("tab:red", "X", "-"),
    "pod-by-pod": ("tab:red", "v", "-"),
    "best-effort-atomic": ("tab:purple", "^", "-."),
    "gang-no-topology": ("tab:gray", "D", ":"),
}


def sweep(
    points: Sequence[SweepPoint],
    mixes: Sequence[str],
    levels: Sequence[str],
    strategies: Sequence[str],
    subtitle: str,
    path: Path,
    level_labels: Sequence[str] | None = None,
) -> None:
    """One column per gang-size mix, one row per metric, scarcity on the x axis."""
    plt = _pyplot()
    by_key = {(p.mix, p.level, p.strategy): p for p in points}
    rows, cols = len(SWEEP_METRICS), len(mixes)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols + 0.8, 2.3 * rows + 1.2), sharex=True, squeeze=False
    )
    xs = list(range(len(levels)))
    for c, mix in enumerate(mixes):
        for r, (metric, label) in enumerate(SWEEP_METRICS):
            ax = axes[r, c]
            for name in strategies:
                ys = []
                for level in levels:
                    point = by_key.get((mix, level, name))
                    value = point.metrics.get(metric) if point else None
                    ys.append(float("nan") if value is None else value)
                color, marker, line = _STYLE.get(name, ("black", "x", "-"))
                ax.plot(xs, ys, color=color, marker=marker, linestyle=line, label=name,
                        markersize=4, linewidth=1.4)
            if r == 0:
                ax.set_title(f"gang-size mix: {mix}", fontsize=10)
            if c == 0:
                ax.set_ylabel(label, fontsize=9)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=8)
        axes[-1, c].set_xticks(xs)
        axes[-1, c].set_xticklabels(level_labels or levels, fontsize=7)
        axes[-1, c].set_xlabel("supply scarcity →", fontsize=9)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", ncol=len(strategies), fontsize=9,
               bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(subtitle, fontsize=8, y=0.955)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
