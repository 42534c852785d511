"""A ProvisioningRequest's ``spec.parameters``, typed per served class. Pure.

Each served class has one pydantic model (:data:`MODELS`, by fit mode): a field per parameter
Muster honours, under the parameter's name as alias, with the validator that reads its
value. Adding a parameter is adding a field (and the code that acts on it); the honoured
names (:data:`HONOURED`) and the ignore rule follow from the models.

Kueue copies parameters into the requests it creates without looking at them: every entry
of the ProvisioningRequestConfig's ``spec.parameters`` and every ``provreq.kueue.x-k8s.io/<name>``
annotation of the Workload (which Kueue's job framework copies from the Job), the annotation
winning (``passProvReqParams`` in Kueue's ``pkg/controller/admissionchecks/provisioning``; KEP
1788: "Kueue would act in the pass through manner"). So any name can reach Muster, including
parameters meant for another provisioner. A name Muster does
not act on therefore never fails a request: it is ignored, and said so (the Accepted
condition's message, a ``ParametersIgnored`` Warning Event, a note on the Provisioned message
Kueue copies into the Workload's admission check). Kueue-managed requests and hand-written
ones are treated alike: the API leaves parameters to each class, and cluster-autoscaler
ignores the names it does not know too.

A parameter Muster honours with a value it cannot read (``noRetry: maybe``) is still invalid
input: Muster cannot do what was asked, and the request fails with ``InvalidParameters``
naming the value.

Each value is read exactly as the shipped admission policy
(``config/admission/provisioningrequest-policy.yaml``, and the chart's copy) reads it, so no
value is refused by one and accepted by the other: the policy's CEL trims with cel-go's
``trim()`` (Go's ``strings.TrimSpace``: Unicode White_Space, not Python's ``str.strip``,
which also strips U+001C..U+001F), lowers with ``lowerAscii()`` (ASCII letters only) and
matches with RE2 (``[0-9]`` is ASCII digits; ``$`` is the end of the text). Python's
``int()`` would also take full-width digits, ``_`` and a leading ``+``. Requests Kueue
creates are exempt from the policy, so for them this reading is the only check.
``tests/api/test_parameter_policy.py`` evaluates the policy's own expressions against this
module on random strings.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from controller.fit.types import Mode

NO_RETRY = "noRetry"
VALID_UNTIL_SECONDS = "ValidUntilSeconds"
PROCESSOR_INSTANCE = "processorInstance"
RELAX_TOPOLOGY_AFTER = "relaxTopologyAfter"
NEVER = "never"
MAX_RUN_DURATION_SECONDS = "maxRunDurationSeconds"


# Go's unicode.IsSpace (what strings.TrimSpace, so cel-go's trim(), strips): '\t', '\n',
# '\v', '\f', '\r', ' ', U+0085, U+00A0 and the other Unicode White_Space characters.
GO_SPACE = (
    "\t\n\v\f\r \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_SECONDS = re.compile(r"[0-9]+", re.ASCII)
# The admission policy's maxRunDurationSeconds rule uses this same pattern: at least one
# non-zero ASCII digit (a run of 0 seconds would end before it starts).
POSITIVE_SECONDS_PATTERN = "^[0-9]*[1-9][0-9]*$"
_POSITIVE_SECONDS = re.compile(r"[0-9]*[1-9][0-9]*", re.ASCII)
_ASCII_UPPER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def cel_trim(text: str) -> str:
    """CEL's ``trim()`` as Kubernetes evaluates it (cel-go ext/strings.go ``trimSpace``)."""
    return text.strip(GO_SPACE)


def cel_lower_ascii(text: str) -> str:
    """CEL's ``lowerAscii()``: ASCII letters lowered, every other character kept."""
    return text.translate(_ASCII_UPPER)


def _problem(text: str) -> PydanticCustomError:
    # The message as the request's condition shows it (no pydantic prefix).
    return PydanticCustomError("parameter", text)


class ClassParameters(BaseModel):
    """The parameters every served class honours."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    no_retry: bool = Field(
        default=False, alias=NO_RETRY,
        description="Fail on the first attempt that finds no capacity or fails to acquire, "
        "no retry.")
    valid_until_seconds: int | None = Field(
        default=None, alias=VALID_UNTIL_SECONDS,
        description="Retry only until this many seconds after the request's creation.")

    max_run_duration_seconds: int | None = Field(
        default=None, alias=MAX_RUN_DURATION_SECONDS,
        description="How long the gang's new nodes run once provisioned: at the end Muster "
        "releases them and ends the booking with CapacityRevoked/RunDurationExpired (the "
        "name GKE's queued-provisioning class and Kueue use). A queued request asks the "
        "cloud's queue for this run. Existing nodes a booking holds are not bounded.")

    relax_topology_after_seconds: float | None = Field(
        default=None, alias=RELAX_TOPOLOGY_AFTER,
        description="How long the request waits for the one topology domain its "
        "muster.dev/required-topology annotation asks for before Muster takes the most "
        "compact placement it can get (one domain of the next wider level before two, fewest "
        "domains): a duration such as 30m, 1h30m, 90s or a number of seconds; never keeps "
        "the placement strict. Absent: topology.relax_after_seconds.")

    @field_validator("relax_topology_after_seconds", mode="before")
    @classmethod
    def _relax_after(cls, value: Any) -> float:
        seconds = duration_seconds(str(value))
        if seconds is None:
            raise _problem(f"parameter {RELAX_TOPOLOGY_AFTER} must be a duration such as 30m, "
                           f"1h30m, 90s or 0, or {NEVER}, got {str(value)!r}")
        return seconds

    @field_validator("max_run_duration_seconds", mode="before")
    @classmethod
    def _max_run(cls, value: Any) -> int:
        text = cel_trim(str(value))
        if _POSITIVE_SECONDS.fullmatch(text) is None:
            raise _problem(f"parameter {MAX_RUN_DURATION_SECONDS} must be a whole number of "
                           f"seconds > 0, got {str(value)!r}")
        return int(text)

    @field_validator("no_retry", mode="before")
    @classmethod
    def _no_retry(cls, value: Any) -> bool:
        text = cel_lower_ascii(cel_trim(str(value)))
        if text not in ("true", "false"):
            raise _problem(f"parameter {NO_RETRY} must be true or false, got {str(value)!r}")
        return text == "true"

    @field_validator("valid_until_seconds", mode="before")
    @classmethod
    def _valid_until(cls, value: Any) -> int:
        text = cel_trim(str(value))
        if _SECONDS.fullmatch(text) is None:
            raise _problem(f"parameter {VALID_UNTIL_SECONDS} must be a whole number of "
                           f"seconds >= 0, got {str(value)!r}")
        # At most 255 digits (the CRD's maxLength), far below int()'s digit limit.
        return int(text)


class AtomicParameters(ClassParameters):
    """``atomic-provisioning.muster.dev`` (and the upstream best-effort-atomic class)."""


class CheckCapacityParameters(ClassParameters):
    """``check-capacity.muster.dev`` (and the upstream check-capacity class)."""

    processor_instance: str = Field(
        default="", alias=PROCESSOR_INSTANCE,
        description="Only the Muster whose classes.processor_instance equals it serves "
        "the request.")


MODELS: Mapping[Mode, type[ClassParameters]] = {
    Mode.CHECK: CheckCapacityParameters,
    Mode.PROVISION: AtomicParameters,
}
"""The parameter model of each fit mode's classes."""

HONOURED: Mapping[Mode, frozenset[str]] = {
    mode: frozenset(str(f.alias) for f in model.model_fields.values())
    for mode, model in MODELS.items()
}
"""Parameters that change what Muster does, per fit mode."""

WHY_IGNORED: Mapping[str, str] = {
    PROCESSOR_INSTANCE: (
        "it picks the processor of check-capacity requests; atomic requests are served "
        "whatever it says, as cluster-autoscaler serves them"
    ),
}
"""Why a known name is ignored in the mode it is ignored in."""


@dataclass(frozen=True, slots=True)
class Parameters:
    """A request's parameters as Muster reads them."""

    values: ClassParameters
    """The honoured parameters' values (defaults for those absent or unreadable)."""
    ignored: dict[str, str] = field(default_factory=dict)
    """Name -> why Muster ignores it."""
    problems: list[str] = field(default_factory=list)
    """Values of honoured parameters Muster cannot read."""

    def note(self) -> str:
        """One sentence naming each ignored parameter and why, or empty."""
        if not self.ignored:
            return ""
        parts = [f"{name} ({why})" for name, why in sorted(self.ignored.items())]
        return f"Muster ignores parameter(s) {'; '.join(parts)}."

    def short_note(self) -> str:
        """The ignored names alone, for messages that point to the full note."""
        if not self.ignored:
            return ""
        return (f"Ignored parameter(s): {', '.join(sorted(self.ignored))} (see the request's "
                f"Accepted condition).")


# The admission policy's relaxTopologyAfter rule uses this same pattern (RE2 and ``re``
# agree on it: ASCII digits, no backtracking constructs).
DURATION_PATTERN = "^(never|[0-9]+|[0-9]+h([0-9]+m)?([0-9]+s)?|[0-9]+m([0-9]+s)?|[0-9]+s)$"
_DURATION = re.compile(r"(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?", re.ASCII)


def duration_seconds(text: str) -> float | None:
    """Seconds of a duration written as Kubernetes and Go write them (``1h30m``, ``90s``) or
    as a whole number of seconds; ``never``: infinity; None when unreadable."""
    # Read as the admission policy reads it: CEL's trim() and lowerAscii(), ASCII digits only.
    text = cel_lower_ascii(cel_trim(text))
    if text == NEVER:
        return math.inf
    if _SECONDS.fullmatch(text):
        return float(text)
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        return None
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


def read_parameters(parameters: Mapping[str, Any], mode: Mode, class_name: str) -> Parameters:
    model = MODELS[mode]
    honoured = HONOURED[mode]
    known = {n.lower(): n for n in honoured}
    ignored = {
        name: WHY_IGNORED.get(name) or _unknown(name, class_name, known)
        for name in parameters if name not in honoured
    }
    given = {name: str(raw) for name, raw in parameters.items() if name in honoured}
    try:
        values = model.model_validate(given)
        problems: list[str] = []
    except ValidationError as exc:
        bad = {str(err["loc"][0]): err["msg"] for err in exc.errors()}
        # In the order the request lists them; the rest of the values still count.
        problems = [bad[name] for name in given if name in bad]
        values = model.model_validate({n: v for n, v in given.items() if n not in bad})
    return Parameters(values=values, ignored=ignored, problems=problems)


def _unknown(name: str, class_name: str, known: Mapping[str, str]) -> str:
    why = f"not a parameter of {class_name}"
    if name.lower() in known:
        why += f"; did you mean {known[name.lower()]}?"
    return why


def processor_instance(parameters: Mapping[str, Any]) -> str:
    """The ``processorInstance`` a check-capacity request names ("" when none)."""
    values = read_parameters(parameters, Mode.CHECK, "").values
    assert isinstance(values, CheckCapacityParameters)
    return values.processor_instance
