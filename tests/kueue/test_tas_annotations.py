"""Kueue's TAS pod-set annotations are read as Kueue reads them (differential).

The oracle below transcribes the rules Kueue applies, from kubernetes-sigs/kueue at
ff69552e79ad21652c36caa97038382e55625cf7: ``pkg/controller/jobframework/tas_validation.go``
(``ValidateTASPodSetRequest``: presence counts, at most one of required / preferred /
unconstrained, ``strconv.ParseBool`` for unconstrained, ``strconv.ParseInt(s, 10, 32)`` and
>= 1 for the slice size, the slice pair together) and ``tas.go`` (``Build``: unconstrained
is ``ParseBool``'s value). The Go functions are transcribed from Go's ``strconv`` (atob.go's
switch; atoi.go's ParseInt: one optional sign, then base-10 ASCII digits, no ``_`` unless the
base is 0, range-checked to the bit size), not from Muster's code.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from controller.common.topology_defaults import KUEUE_PREFERRED, KUEUE_REQUIRED, KUEUE_UNCONSTRAINED
from controller.inputs.tas_slices import (
    SLICE_REQUIRED,
    SLICE_SIZE,
    go_parse_bool,
    go_parse_int32,
    kueue_problems,
    unconstrained,
)
from tests.api.test_validation import reference_qualified_name


def oracle_parse_bool(s: str) -> bool | None:
    # strconv.ParseBool (go/src/strconv/atob.go).
    if s in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if s in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None


def oracle_parse_int32(s: str) -> int | None:
    # strconv.ParseInt(s, 10, 32) (go/src/strconv/atoi.go), character by character.
    if s == "":
        return None
    neg = False
    if s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
        if s == "":
            return None
    n = 0
    for c in s:
        if not ("0" <= c <= "9"):  # base 10: '_' is a syntax error, as is any non-ASCII digit
            return None
        n = n * 10 + (ord(c) - ord("0"))
    n = -n if neg else n
    return n if -(2**31) <= n <= 2**31 - 1 else None


BOOLISH = st.one_of(
    st.sampled_from(["1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false",
                     "False", "tRuE", "yes", "y", "on", " true", "true ", "", "\uff54",
                     "\u0131", "2", "01", "TRUe", "fAlse"]),
    st.text(alphabet="01tTfFrRuUeEaAlLsS ", max_size=6),
    st.text(max_size=6),
)
INTISH = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
    st.integers(min_value=2**31 - 3, max_value=2**31 + 3).map(str),
    st.sampled_from(["", "+", "-", "+4", "-0", "007", "1_0", " 4", "4 ", "\uff14", "\u0664",
                     "0x10", "4.0", "1e3", "--4", "+-4", "2147483647", "2147483648",
                     "-2147483648", "-2147483649"]),
    st.text(alphabet="0123456789+-_ x.", max_size=12),
    st.text(max_size=8),
)


@settings(max_examples=500, deadline=None)
@given(text=BOOLISH)
@example(text="tRuE")
@example(text="1")
def test_booleans_are_go_parse_bool(text: str) -> None:
    assert go_parse_bool(text) == oracle_parse_bool(text), text
    annotations = {KUEUE_UNCONSTRAINED: text}
    assert unconstrained(annotations) is (oracle_parse_bool(text) is True)
    refused = [p for p in kueue_problems(annotations) if KUEUE_UNCONSTRAINED in p]
    assert bool(refused) == (oracle_parse_bool(text) is None), (text, refused)


@settings(max_examples=500, deadline=None)
@given(text=INTISH)
@example(text="+4")
@example(text="\uff14")
@example(text="2147483648")
def test_slice_sizes_are_go_parse_int32(text: str) -> None:
    want = oracle_parse_int32(text)
    assert go_parse_int32(text) == want, text
    problems = kueue_problems({SLICE_REQUIRED: "rack", SLICE_SIZE: text})
    assert bool(problems) == (want is None or want < 1), (text, problems)
    assert all(f"metadata.annotations[{SLICE_SIZE}]" in p for p in problems)


KEYS = [KUEUE_REQUIRED, KUEUE_PREFERRED, KUEUE_UNCONSTRAINED, SLICE_REQUIRED, SLICE_SIZE]


@settings(max_examples=300, deadline=None)
@given(annotations=st.dictionaries(
    st.sampled_from(KEYS),
    st.one_of(st.sampled_from(["rack", "true", "false", "T", "4", "0", "", "a/b/c"]), BOOLISH),
    max_size=5,
))
def test_every_rule_kueue_applies_is_applied(annotations: dict[str, str]) -> None:
    found = kueue_problems(annotations)
    topology = [k for k in (KUEUE_REQUIRED, KUEUE_PREFERRED, KUEUE_UNCONSTRAINED)
                if k in annotations]
    assert any("more than one topology annotation" in p for p in found) == (len(topology) > 1)
    if KUEUE_UNCONSTRAINED in annotations:
        bad = oracle_parse_bool(annotations[KUEUE_UNCONSTRAINED]) is None
        assert any(f"[{KUEUE_UNCONSTRAINED}]" in p for p in found) == bad
    pair = (SLICE_REQUIRED in annotations, SLICE_SIZE in annotations)
    assert any("must be set when" in p for p in found) == (pair == (True, False))
    assert any("may not be set when" in p for p in found) == (pair == (False, True))


@settings(max_examples=300, deadline=None)
@given(level=st.one_of(st.sampled_from(["rack", "/rack", "x.io/rack", "a/b/c", "", "Rack",
                                        "topology.muster.dev/rack", "x.io/", "-r"]),
                       st.text(alphabet="aZ09-_./ é", max_size=20)))
def test_levels_are_label_names_as_kueue_validates_them(level: str) -> None:
    # ValidateTASPodSetRequest: metavalidation.ValidateLabelName (IsQualifiedName).
    for key in (KUEUE_REQUIRED, KUEUE_PREFERRED, SLICE_REQUIRED):
        refused = [p for p in kueue_problems({key: level}) if "must be a label name" in p]
        assert bool(refused) == (not reference_qualified_name(level)), (key, level)
