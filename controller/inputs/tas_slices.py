"""Kueue TAS pod-set annotations, read as Kueue reads them (pure).

Kueue's ``kueue.x-k8s.io/podset-slice-required-topology: <level>`` with
``kueue.x-k8s.io/podset-slice-size: <n>`` asks that every consecutive group of ``n`` pods
of the pod set share one domain of ``level``, together with the pod set's own required or
preferred topology. They become ``TopologyRequest.slice_level`` / ``slice_size``, which the
fit engine plans as one pod set (:mod:`controller.fit.slices`).

``podset-slice-required-topology-constraints`` (multi-layer, alpha) is not planned.

:func:`kueue_problems` mirrors Kueue's own check of these annotations
(``ValidateTASPodSetRequest`` in ``pkg/controller/jobframework/tas_validation.go``, and
``Build`` in ``tas.go``, of kubernetes-sigs/kueue at ff69552e): an annotation counts when
its key is present, whatever its value; at most one of required / preferred /
unconstrained; the levels are label names (``ValidateLabelName``); unconstrained is read
by Go's ``strconv.ParseBool``; the slice size by ``strconv.ParseInt(s, 10, 32)`` and must
be >= 1; the slice pair is set together. Kueue refuses such a Workload at its webhook;
Muster refuses such a template (a request written by hand never met that webhook), naming
the annotation, rather than reading a value Kueue would not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from controller.api.validation import qualified_name
from controller.common.topology_defaults import KUEUE_PREFERRED, KUEUE_REQUIRED, KUEUE_UNCONSTRAINED

SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"

GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
            "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}
"""Every spelling Go's ``strconv.ParseBool`` accepts, and its value."""
_GO_DECIMAL = re.compile(r"[+-]?[0-9]+", re.ASCII)
_INT32 = range(-(2**31), 2**31)


def go_parse_bool(text: str) -> bool | None:
    """``strconv.ParseBool``: the value, or None where Go returns an error."""
    return GO_BOOLS.get(text)


def go_parse_int32(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 32)``: an optional sign and ASCII digits (no spaces, no
    ``_`` in base 10), within int32; None where Go returns an error."""
    if _GO_DECIMAL.fullmatch(text) is None:
        return None
    value = int(text)
    return value if value in _INT32 else None


def unconstrained(annotations: Mapping[str, str]) -> bool:
    """The pod set asks for TAS without a level (``podset-unconstrained-topology`` true)."""
    return go_parse_bool(annotations.get(KUEUE_UNCONSTRAINED, "")) is True


def _at(key: str) -> str:
    return f"metadata.annotations[{key}]"


def kueue_problems(annotations: Mapping[str, str]) -> list[str]:
    """What Kueue's webhook would refuse in these pod-set annotations (empty when none)."""
    out = []
    topology = [k for k in (KUEUE_REQUIRED, KUEUE_PREFERRED, KUEUE_UNCONSTRAINED)
                if k in annotations]
    if len(topology) > 1:
        out.append(f"metadata.annotations: must not contain more than one topology "
                   f"annotation, got {' and '.join(topology)}")
    for key in (KUEUE_REQUIRED, KUEUE_PREFERRED, SLICE_REQUIRED):
        if key in annotations and not qualified_name(annotations[key]):
            out.append(f"{_at(key)}: must be a label name ([prefix/]name), got "
                       f"{annotations[key]!r}")
    if KUEUE_UNCONSTRAINED in annotations and (
        go_parse_bool(annotations[KUEUE_UNCONSTRAINED]) is None
    ):
        out.append(f"{_at(KUEUE_UNCONSTRAINED)}: must be a boolean value as Kueue reads it "
                   f"({', '.join(GO_BOOLS)}), got {annotations[KUEUE_UNCONSTRAINED]!r}")
    if SLICE_SIZE in annotations:
        size = go_parse_int32(annotations[SLICE_SIZE])
        if size is None:
            out.append(f"{_at(SLICE_SIZE)}: must be a numeric value (a 32-bit integer), got "
                       f"{annotations[SLICE_SIZE]!r}")
        elif size < 1:
            out.append(f"{_at(SLICE_SIZE)}: must be greater than or equal to 1, got "
                       f"{annotations[SLICE_SIZE]!r}")
    if SLICE_REQUIRED in annotations and SLICE_SIZE not in annotations:
        out.append(f"{_at(SLICE_SIZE)}: must be set when {SLICE_REQUIRED} is specified")
    if SLICE_SIZE in annotations and SLICE_REQUIRED not in annotations:
        out.append(f"{_at(SLICE_SIZE)}: may not be set when {SLICE_REQUIRED} is not specified")
    return out


class BadSlices(ValueError):
    """Slice annotations Muster cannot use (names the annotation and the value)."""


def slice_request(
    annotations: Mapping[str, str], levels: Sequence[str]
) -> tuple[str, int] | None:
    """(level, size) of the slice annotations, None when absent; :class:`BadSlices` when
    only one of the pair is set or the size is not a positive integer."""
    level = annotations.get(SLICE_REQUIRED)
    size = annotations.get(SLICE_SIZE)
    if level is None and size is None:
        return None
    if level is None or size is None:
        raise BadSlices(f"{SLICE_REQUIRED} and {SLICE_SIZE} must be set together")
    n = go_parse_int32(size)
    if n is None or n < 1:
        raise BadSlices(f"{SLICE_SIZE} must be a positive integer, got {size!r}")
    short = [lv for lv in levels if lv.rsplit("/", 1)[-1] == level]
    return (level if level in levels or len(short) != 1 else short[0]), n
