"""``muster simulate`` as a user runs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from controller.cli import app
from controller.simulate.strategies import STRATEGIES

runner = CliRunner()

HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
ROWS = [
    "2017-10-01 00:00:00,3600,32,115200,a",
    "2017-10-01 00:00:00,3600,32,115200,a",
    "2017-10-01 00:05:00,1800,1,1800,b",
    "2017-10-01 01:00:00,600,8,4800,b",
]
SUMMARY = re.compile(
    r"^simulate jobs=(\d+) muster_stranded_gpu_h=(\d+\.\d) podbypod_stranded_gpu_h=(\d+\.\d) "
    r"muster_paid_gpu_h=(\d+\.\d) podbypod_paid_gpu_h=(\d+\.\d)$"
)


def write(tmp_path: Path, text: str = HEADER + "\n".join(ROWS) + "\n") -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_summary_is_the_last_line(tmp_path: Path) -> None:
    png = tmp_path / "plot.png"
    result = runner.invoke(
        app,
        ["simulate", "--trace", str(write(tmp_path)), "--summary", "--quota-gpus", "48",
         "--plot", str(png)],
    )
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    match = SUMMARY.match(last)
    assert match, last
    jobs, m_stranded, p_stranded, m_paid, p_paid = match.groups()
    assert jobs == "4"
    assert float(m_paid) > 0 and float(p_paid) > 0
    assert float(m_stranded) <= float(m_paid)
    # The two 32-GPU gangs deadlock under pod-by-pod with a 6-node quota: more is stranded.
    assert float(p_stranded) > float(m_stranded)
    assert "GPU-hours paid" in result.output  # the table came first
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_output(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["simulate", "--trace", str(write(tmp_path)), "--json", "--no-plot"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"trace", "config", "strategies"}
    assert data["trace"]["jobs"] == 4
    assert list(data["strategies"]) == list(STRATEGIES)
    for r in data["strategies"].values():
        assert {
            "paid_gpu_h",
            "used_gpu_h",
            "stranded_gpu_h",
            "stranded_waiting_gpu_h",
            "stranded_idle_gpu_h",
            "stranded_booting_gpu_h",
            "wait_p50_s",
            "wait_p95_s",
            "wait_p99_s",
            "never_started",
            "timed_out",
            "never_fits",
            "failed",
            "cost",
            "gangs_one_rack_fraction",
        } <= set(r)
        assert r["jobs"] == 4
        assert r["stranded_gpu_h"] == r["paid_gpu_h"] - r["used_gpu_h"]


def test_trace_selection_options(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["simulate", "--trace", str(write(tmp_path)), "--json", "--no-plot", "--cluster", "b",
         "--strategy", "pod-by-pod", "--start", "2017-10-01 00:01"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["trace"]["jobs"] == 2
    assert list(data["strategies"]) == ["pod-by-pod"]


def test_csv_without_a_required_column_exits_2_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp,duration,gpus,cluster\n2017-10-01 00:00:00,1,1,a\n")
    result = runner.invoke(app, ["simulate", "--trace", str(path), "--no-plot"])
    assert result.exit_code == 2
    assert "missing column 'num_gpus'" in result.output
    assert "Traceback" not in result.output


def test_bad_value_exits_2_naming_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "2017-10-01 00:00:00,soon,1,1,a\n")
    result = runner.invoke(app, ["simulate", "--trace", str(path), "--no-plot"])
    assert result.exit_code == 2
    assert "trace.csv:2: column 'duration'" in result.output


def test_bad_options_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path)
    for args, message in (
        (["--strategy", "greedy"], "unknown strategy greedy"),
        (["--strategy", "muster", "--summary"], "--summary compares muster with pod-by-pod"),
        (["--boot-min", "300"], "boot latency"),
        (["--start", "tomorrow"], "--start/--end"),
        (["--cluster", "zzz"], "no job left"),
        (["--retry-attempts", "0"], "retry attempts must be >= 1"),
        (["--retry-initial", "60", "--retry-max", "30"], "retry backoff needs 0 < initial <= max"),
    ):
        result = runner.invoke(app, ["simulate", "--trace", str(path), "--no-plot", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)


def test_sweep_writes_a_csv_and_a_png_and_states_its_time(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    result = runner.invoke(
        app,
        ["simulate", "--trace", str(write(tmp_path)), "--sweep", "--sweep-dir", str(out),
         "--windows", "1", "--window-days", "1", "--workers", "2",
         "--strategy", "muster", "--strategy", "pod-by-pod"],
    )
    assert result.exit_code == 0, result.output
    rows = (out / "sweep.csv").read_text().splitlines()
    # 5 scarcity levels x 3 mixes x 1 window x 2 strategies, plus the header.
    assert len(rows) == 1 + 5 * 3 * 2
    assert rows[0].startswith("mix,level,level_index,quota_fraction")
    assert ",never_started,failed," in rows[0]
    assert ",retries,retries_peak_per_min," in rows[0]
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| ample (1.5x peak) |" in result.output
    assert re.search(r"sweep: 30 runs .* in \d+\.\d s wall on 2 processes", result.output)
