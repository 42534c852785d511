"""One structured log line per decision Muster takes: plan, acquire, end (a booking
consumed, revoked or expired), release, fail.

``log_decision("plan", "ns/train", outcome="fits", new_nodes=4, ...)`` logs at INFO on the
``muster.decisions`` logger. As text (``log_format: text``) the line reads
``decision=plan request=ns/train outcome=fits new_nodes=4 ...``; as JSON (``log_format:
json``) the fields are top-level keys of the line's object next to ``ts``, ``level`` and
``msg`` (:class:`controller.commands.run._JsonFormatter` reads :data:`FIELDS_ATTR`), so a log
collector can filter on ``decision`` and ``request`` without parsing the message.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger("muster.decisions")

FIELDS_ATTR = "muster_fields"
"""The LogRecord attribute carrying a decision's fields."""

KINDS = frozenset({"plan", "acquire", "end", "release", "fail"})


def log_decision(kind: str, request: str, **fields: Any) -> None:
    """Log decision ``kind`` about ``request`` (``<namespace>/<name>``, or the pool's owner)."""
    if kind not in KINDS:
        raise ValueError(f"unknown decision kind {kind!r}")
    if not log.isEnabledFor(logging.INFO):
        return
    record = {"decision": kind, "request": request, **fields}
    text = " ".join(f"{k}={_text(v)}" for k, v in record.items())
    log.info("%s", text, extra={FIELDS_ATTR: record})


def _text(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value) if (" " in value or not value) else value
    return json.dumps(value, separators=(",", ":"), default=str)
