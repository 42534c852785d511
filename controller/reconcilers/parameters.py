"""What Muster does with a ProvisioningRequest's ``spec.parameters``. Pure.

Kueue copies parameters into the requests it creates without looking at them: every entry
of the ProvisioningRequestConfig's ``spec.parameters`` and every ``provreq.kueue.x-k8s.io/<name>``
annotation of the Workload (which Kueue's job framework copies from the Job), the annotation
winning (``passProvReqParams`` in Kueue's ``pkg/controller/admissionchecks/provisioning``; KEP
1788: "Kueue would act in the pass through manner"). So any name can reach Muster, including
parameters meant for another provisioner (GKE's ``maxRunDurationSeconds``). A name Muster does
not act on therefore never fails a request: it is ignored, and said so (the Accepted
condition's message, a ``ParametersIgnored`` Warning Event, a note on the Provisioned message
Kueue copies into the Workload's admission check). Kueue-managed requests and hand-written
ones are treated alike: the API leaves parameters to each class, and cluster-autoscaler
ignores the names it does not know too.

A parameter Muster honours with a value it cannot read (``noRetry: maybe``) is still invalid
input: Muster cannot do what was asked, and the request fails with ``InvalidParameters``
naming the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.fit.types import Mode

NO_RETRY = "noRetry"
VALID_UNTIL_SECONDS = "ValidUntilSeconds"
PROCESSOR_INSTANCE = "processorInstance"
MAX_RUN_DURATION_SECONDS = "maxRunDurationSeconds"

HONOURED: Mapping[Mode, frozenset[str]] = {
    Mode.CHECK: frozenset({NO_RETRY, VALID_UNTIL_SECONDS, PROCESSOR_INSTANCE}),
    Mode.PROVISION: frozenset({NO_RETRY, VALID_UNTIL_SECONDS}),
}
"""Parameters that change what Muster does, per fit mode."""

WHY_IGNORED: Mapping[str, str] = {
    PROCESSOR_INSTANCE: (
        "it picks the processor of check-capacity requests; atomic requests are served "
        "whatever it says, as cluster-autoscaler serves them"
    ),
    MAX_RUN_DURATION_SECONDS: (
        "Muster does not bound how long nodes run (a GKE queued-provisioning parameter); "
        "Kueue's maximumExecutionTimeSeconds ends the job, and Muster releases the gang's "
        "nodes acquisition.idle_ttl_seconds after its pods are gone"
    ),
}
"""Why a known name is ignored in the mode it is ignored in."""


@dataclass(frozen=True, slots=True)
class Parameters:
    """A request's parameters as Muster reads them."""

    no_retry: bool = False
    """Fail on the first attempt that finds no capacity or fails to acquire, no retry."""
    valid_until_seconds: int | None = None
    """Retry only until this many seconds after the request's creation."""
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


def read_parameters(parameters: Mapping[str, str], mode: Mode, class_name: str) -> Parameters:
    honoured = HONOURED[mode]
    known = {n.lower(): n for n in honoured}
    ignored: dict[str, str] = {}
    problems: list[str] = []
    no_retry = False
    valid_until: int | None = None
    for name, raw in parameters.items():
        value = str(raw)
        if name not in honoured:
            ignored[name] = WHY_IGNORED.get(name) or _unknown(name, class_name, known)
        elif name == NO_RETRY:
            if value.strip().lower() not in ("true", "false"):
                problems.append(f"parameter {NO_RETRY} must be true or false, got {value!r}")
            no_retry = value.strip().lower() == "true"
        elif name == VALID_UNTIL_SECONDS:
            try:
                valid_until = int(value.strip())
            except ValueError:
                valid_until = None
            if valid_until is None or valid_until < 0:
                problems.append(f"parameter {VALID_UNTIL_SECONDS} must be a whole number of "
                                f"seconds >= 0, got {value!r}")
                valid_until = None
    return Parameters(no_retry=no_retry, valid_until_seconds=valid_until, ignored=ignored,
                      problems=problems)


def _unknown(name: str, class_name: str, known: Mapping[str, str]) -> str:
    why = f"not a parameter of {class_name}"
    if name.lower() in known:
        why += f"; did you mean {known[name.lower()]}?"
    return why
