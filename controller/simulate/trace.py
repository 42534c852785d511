"""Job traces: read a GPU-job CSV, validate it, and cut it down (time window, clusters,
seeded sample, job count) before the simulator replays it.

The format is the Philly trace as published by petuum/adaptdl
(``timestamp,duration,num_gpus,gpu_time,cluster``); ``gpu_time`` is optional and ignored
because it is always ``duration x num_gpus``.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REQUIRED_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")


class TraceError(ValueError):
    """The trace cannot be used; the message names the file, the row and the column."""


@dataclass(frozen=True, slots=True)
class Job:
    seq: int
    """Position in the (filtered) trace, 0-based: the tie-breaker for equal submit times."""
    submit: float
    """Seconds since the first submit of the filtered trace."""
    duration: float
    """Run time in seconds once every pod runs."""
    gpus: int
    cluster: str


@dataclass(frozen=True, slots=True)
class Trace:
    jobs: tuple[Job, ...]
    origin: datetime
    """Wall-clock submit time of the first job (``submit == 0``)."""
    source: str

    @property
    def span_seconds(self) -> float:
        return self.jobs[-1].submit if self.jobs else 0.0


@dataclass(frozen=True, slots=True)
class TraceFilter:
    start: datetime | None = None
    """Keep jobs submitted at or after this UTC time."""
    end: datetime | None = None
    """Keep jobs submitted before this UTC time."""
    clusters: frozenset[str] = frozenset()
    """Keep only these virtual clusters (empty: all)."""
    sample: float = 1.0
    """Keep each job with this probability (seeded)."""
    limit: int | None = None
    """Keep at most this many jobs (the earliest, after the other filters)."""
    min_gpus: int = 1
    """Keep only jobs of at least this many GPUs (e.g. 9: gangs only)."""
    seed: int = 0


def parse_time(text: str) -> datetime:
    """Parse ``YYYY-MM-DD[ HH:MM[:SS]]`` as UTC; raise ValueError with the accepted forms."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise ValueError(
            f"{text!r} is not a time; use YYYY-MM-DD or 'YYYY-MM-DD HH:MM:SS' (UTC)"
        ) from exc
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def load_trace(path: Path, selection: TraceFilter | None = None) -> Trace:
    """Read ``path``, keep the jobs ``selection`` asks for, and sort them by submit time."""
    selection = selection or TraceFilter()
    if not 0.0 < selection.sample <= 1.0:
        raise TraceError(f"sample must be in (0, 1], got {selection.sample}")
    if selection.limit is not None and selection.limit < 1:
        raise TraceError(f"limit must be at least 1, got {selection.limit}")
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = _read_rows(path, csv.reader(handle))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a UTF-8 text file ({exc.reason})") from exc
    except csv.Error as exc:
        raise TraceError(f"{path}: not a valid CSV file: {exc}") from exc
    rows.sort(key=lambda r: r[0])  # stable: equal timestamps keep file order
    rows = [r for r in rows if _keep(r, selection)]
    if selection.sample < 1.0:
        rng = random.Random(selection.seed)
        rows = [r for r in rows if rng.random() < selection.sample]
    if selection.limit is not None:
        rows = rows[: selection.limit]
    if not rows:
        return Trace(jobs=(), origin=datetime.fromtimestamp(0, UTC), source=str(path))
    origin = rows[0][0]
    jobs = tuple(
        Job(
            seq=i,
            submit=(ts - origin).total_seconds(),
            duration=duration,
            gpus=gpus,
            cluster=cluster,
        )
        for i, (ts, duration, gpus, cluster) in enumerate(rows)
    )
    return Trace(jobs=jobs, origin=origin, source=str(path))


_Row = tuple[datetime, float, int, str]


def _keep(row: _Row, selection: TraceFilter) -> bool:
    ts, _, _, cluster = row
    if selection.start is not None and ts < selection.start:
        return False
    if selection.end is not None and ts >= selection.end:
        return False
    if row[2] < selection.min_gpus:
        return False
    return not selection.clusters or cluster in selection.clusters


def _read_rows(path: Path, reader: Iterable[list[str]]) -> list[_Row]:
    iterator = iter(reader)
    header = next(iterator, None)
    if header is None:
        raise TraceError(
            f"{path}: empty file; expected a header with {', '.join(REQUIRED_COLUMNS)}"
        )
    names = [h.strip() for h in header]
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise TraceError(
            f"{path}: missing column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(m) for m in missing)} "
            f"(the header must name {', '.join(REQUIRED_COLUMNS)}; found {', '.join(names)})"
        )
    i_ts, i_dur, i_gpu, i_cl = (names.index(c) for c in REQUIRED_COLUMNS)
    width = max(i_ts, i_dur, i_gpu, i_cl) + 1
    rows: list[_Row] = []
    for line_no, record in enumerate(iterator, start=2):
        if not record or all(not cell.strip() for cell in record):
            continue
        if len(record) < width:
            raise TraceError(f"{path}:{line_no}: {len(record)} fields, the header has {len(names)}")
        rows.append(
            (
                _parse_ts(path, line_no, record[i_ts]),
                _parse_duration(path, line_no, record[i_dur]),
                _parse_gpus(path, line_no, record[i_gpu]),
                record[i_cl].strip(),
            )
        )
    return rows


def _parse_ts(path: Path, line_no: int, text: str) -> datetime:
    try:
        return parse_time(text)
    except ValueError as exc:
        raise TraceError(f"{path}:{line_no}: column 'timestamp': {exc}") from exc


def _parse_duration(path: Path, line_no: int, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(
            f"{path}:{line_no}: column 'duration': {text!r} is not a number of seconds"
        ) from None
    if not math.isfinite(value) or value < 0.0:
        raise TraceError(f"{path}:{line_no}: column 'duration': {text!r} must be >= 0 and finite")
    return value


def _parse_gpus(path: Path, line_no: int, text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{path}:{line_no}: column 'num_gpus': {text!r} is not a number") from None
    if not math.isfinite(value) or value != int(value):
        raise TraceError(f"{path}:{line_no}: column 'num_gpus': {text!r} is not a whole number")
    if value < 1:
        raise TraceError(f"{path}:{line_no}: column 'num_gpus': {text!r} must be at least 1")
    return int(value)
