"""Reading and cutting down job traces."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.simulate.trace import TraceError, TraceFilter, load_trace

CSV = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-01 00:00:10,100.0,1,100.0,aaa
2017-10-01 00:00:00,50.0,8,400.0,bbb
2017-10-02 12:00:00,10.0,16,160.0,aaa
2017-10-03 00:00:00,5.0,2,10.0,ccc
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_jobs_are_sorted_and_timed_from_the_first_submit(tmp_path: Path) -> None:
    t = load_trace(write(tmp_path, CSV))
    assert [(j.submit, j.gpus, j.cluster) for j in t.jobs] == [
        (0.0, 8, "bbb"),
        (10.0, 1, "aaa"),
        (129600.0, 16, "aaa"),
        (172800.0, 2, "ccc"),
    ]
    assert [j.seq for j in t.jobs] == [0, 1, 2, 3]
    assert t.origin == datetime(2017, 10, 1, tzinfo=UTC)


def test_time_window_cluster_and_limit(tmp_path: Path) -> None:
    path = write(tmp_path, CSV)
    window = TraceFilter(
        start=datetime(2017, 10, 1, 0, 0, 5, tzinfo=UTC), end=datetime(2017, 10, 3, tzinfo=UTC)
    )
    assert [j.gpus for j in load_trace(path, window).jobs] == [1, 16]
    assert load_trace(path, window).jobs[0].submit == 0.0  # re-based on the first kept job
    assert [j.gpus for j in load_trace(path, TraceFilter(clusters=frozenset({"aaa"}))).jobs] == [
        1,
        16,
    ]
    assert [j.gpus for j in load_trace(path, TraceFilter(limit=2)).jobs] == [8, 1]


def test_sampling_is_seeded(tmp_path: Path) -> None:
    rows = "".join(f"2017-10-01 00:{i // 60:02d}:{i % 60:02d},1,1,1,a\n" for i in range(400))
    path = write(tmp_path, "timestamp,duration,num_gpus,gpu_time,cluster\n" + rows)
    a = load_trace(path, TraceFilter(sample=0.25, seed=7))
    b = load_trace(path, TraceFilter(sample=0.25, seed=7))
    c = load_trace(path, TraceFilter(sample=0.25, seed=8))
    assert a.jobs == b.jobs
    assert a.jobs != c.jobs
    assert 60 < len(a.jobs) < 140


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("timestamp,duration,gpus,cluster\n", "missing column 'num_gpus'"),
        ("", "empty file"),
        (
            "timestamp,duration,num_gpus,cluster\nyesterday,1,1,a\n",
            r"trace.csv:2: column 'timestamp'",
        ),
        ("timestamp,duration,num_gpus,cluster\n2017-10-01,x,1,a\n", "column 'duration'"),
        ("timestamp,duration,num_gpus,cluster\n2017-10-01,-1,1,a\n", "column 'duration'"),
        ("timestamp,duration,num_gpus,cluster\n2017-10-01,1,1.5,a\n", "column 'num_gpus'"),
        ("timestamp,duration,num_gpus,cluster\n2017-10-01,1,0,a\n", "column 'num_gpus'"),
        ("timestamp,duration,num_gpus,cluster\n2017-10-01,1\n", "2 fields"),
    ],
)
def test_bad_traces_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        load_trace(write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "nope.csv")


def test_min_gpus_keeps_only_large_jobs(tmp_path: Path) -> None:
    t = load_trace(write(tmp_path, CSV), TraceFilter(min_gpus=8))
    assert [j.gpus for j in t.jobs] == [8, 16]
