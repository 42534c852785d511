"""controller_bench and kueue_bench on the sandbox and on a real cluster, one after the other,
as one Markdown table (docs/benchmarks/side-by-side.md).

    python3 -m benchmarks.side_by_side --kubeconfig .cluster/admin.kubeconfig \\
        --muster-kubeconfig .cluster/muster.kubeconfig [--requests 200] [--rate 50] \\
        [--workloads 200] [--only sandbox|real]

Each benchmark runs in its own process, with the same N on both sides: controller_bench
all at once and at ``--rate``; kueue_bench
with path B in the sandbox (Kueue played by hand) and path A with real Kueue (see
benchmarks/kueue_bench.py for why). Prints each run's command and its detail lines (where
the time went, API priority and fairness, cleanup), then the table.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DETAIL = ("per request", "API priority", "cleanup", "admitted by Kueue", "quota reserved over",
          "latency to Provisioned", "timeout", "only ")


@dataclass
class Run:
    argv: list[str]
    output: str = ""
    seconds: float = 0.0
    code: int = 0
    values: dict[str, str] = field(default_factory=dict)

    @property
    def command(self) -> str:
        return "python3 -m " + " ".join(shlex.quote(a) for a in self.argv)

    def line(self, prefix: str) -> str:
        return next((ln for ln in self.output.splitlines() if ln.startswith(prefix)), "")


def execute(argv: list[str]) -> Run:
    run = Run(argv)
    print(f"$ {run.command}", flush=True)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    run.seconds = time.monotonic() - started
    run.code = done.returncode
    run.output = done.stdout
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    run.values = dict(re.findall(r"(\w+)=(\S+)", last))
    for ln in done.stdout.splitlines():
        if ln.startswith(DETAIL):
            print(f"  {ln}")
    print(f"  ({run.seconds:.0f} s wall, exit {run.code})", flush=True)
    if run.code != 0:
        print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
    return run


def controller_cell(run: Run | None) -> str:
    if run is None:
        return ""
    if run.code != 0 or "per_s" not in run.values:
        return f"failed (exit {run.code})"
    m = re.search(r"p50 ([\d.]+)s\s+p99 ([\d.]+)s", run.line("latency to Provisioned"))
    p50, p99 = (float(m[1]), float(m[2])) if m else (float("nan"), float("nan"))
    n = run.values.get("requests", "?")
    return (f"{float(run.values['per_s']):.1f} requests/s ({n} Provisioned), "
            f"p50 {_s(p50)}, p99 {_s(p99)}")


def kueue_cell(run: Run | None) -> str:
    if run is None:
        return ""
    if run.code != 0 or "per_s" not in run.values:
        return f"failed (exit {run.code})"
    cell = (f"{float(run.values['per_s']):.1f} Workloads/s to check Ready "
            f"({run.values.get('workloads', '?')} Ready), reservation → Ready p99 "
            f"{_s(float(run.values['p99_s']))}")
    m = re.search(r"\(([\d.]+)/s\); reservation -> Admitted p50 [\d.]+s p99 ([\d.]+)s",
                  run.line("admitted by Kueue"))
    if m:
        cell += f"; {float(m[1]):.1f} admitted/s, p99 {_s(float(m[2]))}"
    return cell


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="side_by_side", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--muster-kubeconfig", type=Path)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--workloads", type=int, default=200)
    parser.add_argument("--only", choices=["sandbox", "real"])
    parser.add_argument("--skip-kueue", action="store_true")
    args = parser.parse_args(argv)
    sides = ["sandbox", "real"] if args.only is None else [args.only]
    if "real" in sides and args.kubeconfig is None:
        parser.error("the real side needs --kubeconfig (or --only sandbox)")
    real_args = [f"--kubeconfig={args.kubeconfig}"]
    if args.muster_kubeconfig:
        real_args.append(f"--muster-kubeconfig={args.muster_kubeconfig}")
    print(f"side by side, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")

    rows: list[tuple[str, str, dict[str, Run]]] = []
    rate = f"{args.rate:g}"
    for arrivals, extra in (("all at once", []), (f"{rate} per second", [f"--rate={rate}"])):
        runs = {}
        for side in sides:
            runs[side] = execute(["benchmarks.controller_bench",
                                  f"--requests={args.requests}", *extra,
                                  *(real_args if side == "real" else [])])
        rows.append((f"controller_bench, {args.requests} requests", arrivals, runs))
    kueue: dict[str, Run] = {}
    if not args.skip_kueue:
        for side in sides:
            kueue[side] = execute(["benchmarks.kueue_bench", f"--workloads={args.workloads}",
                                   *(real_args if side == "real" else [])])

    print()
    print("| benchmark | variant | sandbox | real cluster |")
    print("| --- | --- | --- | --- |")
    for what, variant, runs in rows:
        print(f"| {what} | {variant} | {controller_cell(runs.get('sandbox'))} | "
              f"{controller_cell(runs.get('real'))} |")
    if kueue:
        print(f"| kueue_bench, {args.workloads} Workloads x 4 workers, quota at once | "
              f"sandbox: path B, Kueue played by hand; real: path A, real Kueue | "
              f"{kueue_cell(kueue.get('sandbox'))} | {kueue_cell(kueue.get('real'))} |")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    every = [r for _, _, runs in rows for r in runs.values()] + list(kueue.values())
    return 1 if any(r.code != 0 for r in every) else 0


if __name__ == "__main__":
    sys.exit(main())
