"""The admission policy and the controller read every parameter value alike (differential).

The policy's own CEL expressions (config/admission/provisioningrequest-policy.yaml, and the
chart's copy, which must be the same) are compiled with cel-expr-python (Google's cel-cpp,
whose ``matches()`` is RE2, as cel-go's is) and evaluated on random strings next to
:func:`controller.api.parameters.read_parameters`: a value is refused by the policy exactly
when the controller finds a problem in it. cel-cpp has no ``trim()``/``lowerAscii()`` (they
come from cel-go's strings extension, which Kubernetes enables); they are declared here as
cel-go defines them (ext/strings.go at google/cel-go 14f6746a: ``strings.TrimSpace`` and an
ASCII-only ``unicode.ToLower``), with the whitespace list written out from Go's
``unicode.IsSpace``, independently of the controller's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cel_expr_python.cel as cel
import pytest
import yaml
from cel_expr_python.ext import ext_bindings
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from controller.api.parameters import (
    HONOURED,
    MAX_RUN_DURATION_SECONDS,
    NO_RETRY,
    PROCESSOR_INSTANCE,
    RELAX_TOPOLOGY_AFTER,
    VALID_UNTIL_SECONDS,
    read_parameters,
)
from controller.fit.types import Mode

ROOT = Path(__file__).resolve().parents[2]
CONFIG_POLICY = ROOT / "config" / "admission" / "provisioningrequest-policy.yaml"
CHART_POLICY = ROOT / "charts" / "muster" / "templates" / "admission.yaml"
POLICY_NAME = "muster-provisioningrequests"

# Go's unicode.IsSpace: Latin-1 '\t' '\n' '\v' '\f' '\r' ' ' U+0085 U+00A0, then the
# White_Space table (U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000).
_GO_IS_SPACE = frozenset(
    [chr(c) for c in (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680)]
    + [chr(c) for c in range(0x2000, 0x200B)]
    + [chr(c) for c in (0x2028, 0x2029, 0x202F, 0x205F, 0x3000)]
)


def _go_trim_space(s: str) -> str:
    start, end = 0, len(s)
    while start < end and s[start] in _GO_IS_SPACE:
        start += 1
    while end > start and s[end - 1] in _GO_IS_SPACE:
        end -= 1
    return s[start:end]


def _go_lower_ascii(s: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in s)


def _policy_docs(text: str) -> list[dict[str, Any]]:
    # The chart template's only Helm directives are the enclosing if/end lines.
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("{{")]
    return [d for d in yaml.safe_load_all("\n".join(lines)) if d]


def _validations(path: Path) -> list[dict[str, Any]]:
    for doc in _policy_docs(path.read_text()):
        if doc["kind"] == "ValidatingAdmissionPolicy" and doc["metadata"]["name"] == POLICY_NAME:
            return list(doc["spec"]["validations"])
    raise AssertionError(f"{path}: no ValidatingAdmissionPolicy {POLICY_NAME}")


def _env() -> Any:
    string = cel.Type.STRING
    return cel.NewEnv(
        variables={"variables": cel.Type.DYN},
        functions=[
            cel.FunctionDecl("trim", [cel.Overload(
                "string_trim", string, [string], is_member=True, impl=_go_trim_space)]),
            cel.FunctionDecl("lowerAscii", [cel.Overload(
                "string_lower_ascii", string, [string], is_member=True, impl=_go_lower_ascii)]),
        ],
        extensions=[ext_bindings.ExtBindings()],
    )


ENV = _env()
PROGRAMS = [ENV.compile(v["expression"]) for v in _validations(CONFIG_POLICY)]


def policy_admits(params: dict[str, str]) -> bool:
    for program in PROGRAMS:
        value = program.eval(data={"variables": {"params": params}})
        assert value.type() == cel.Type.BOOL, value.value()
        if not value.value():
            return False
    return True


def controller_admits(params: dict[str, str]) -> bool:
    got = [read_parameters(params, mode, "x").problems for mode in (Mode.PROVISION, Mode.CHECK)]
    assert got[0] == got[1]  # every mode reads the shared parameters alike
    return not got[0]


def test_the_chart_ships_the_same_rules() -> None:
    assert _validations(CHART_POLICY) == _validations(CONFIG_POLICY)


def test_the_cel_runtime_matches_with_re2_semantics() -> None:
    # RE2's $ (no m flag) is the end of the text; Python's re.search would accept "5\n".
    program = ENV.compile("variables.s.matches('^[0-9]+$')")
    assert program.eval(data={"variables": {"s": "5"}}).value() is True
    assert program.eval(data={"variables": {"s": "5\n"}}).value() is False
    assert program.eval(data={"variables": {"s": "\uff15"}}).value() is False


def test_every_value_the_policy_checks_is_honoured() -> None:
    assert {NO_RETRY, VALID_UNTIL_SECONDS, RELAX_TOPOLOGY_AFTER, MAX_RUN_DURATION_SECONDS} <= (
        HONOURED[Mode.PROVISION] & HONOURED[Mode.CHECK])
    # processorInstance takes any string: neither the policy nor the controller refuses one
    # (the map test below draws it too).
    assert PROCESSOR_INSTANCE in HONOURED[Mode.CHECK]


_TRICKY = st.sampled_from([
    "0", "7", "15", "+15", "-1", "1_0", "1 0", "\uff11\uff15", "\u0661\u0665", "1e3", "0x10",
    "15.0", "", " ", "\t15\n", "\u00a015\u3000", "15\x1c", "\x1f15", "\u200b15", "15\u0085",
    "\u180e15", "9" * 255, "true", "TRUE", "True", " tRuE ", "false", "FALSE", "1", "t", "yes",
    "\u0130", "tru\u0435", "\uff54\uff52\uff55\uff45", "\ufefftrue", "\u2003false\u2028",
    "30m", "1h30m", "90s", "1H", "h", "m", "1h1h", "1s1m", "never", " NEVER ", "\uff13\uff10m",
    "\u0663s", "1.5h", "-5m", "+5m", "0s", "1d", "00", "0600", "604800",
])
_PIECES = st.text(
    alphabet=st.sampled_from(list("0123456789+-_ .eExTtRrUuFfAaLlSshmHMnNvV") + sorted(_GO_IS_SPACE)
                             + ["\x1c", "\x1f", "\u200b", "\ufeff", "\uff10", "\u0661",
                                "\u0130", "\u212a", "\u017f"]),
    max_size=12,
)
VALUES = st.one_of(
    _TRICKY,
    _PIECES,
    # Kubernetes strings are UTF-8 (no lone surrogates); cel-expr-python's binding cuts a
    # string at NUL, so the runtime cannot be asked about one.
    st.text(alphabet=st.characters(codec="utf-8", min_codepoint=1),
            max_size=20),
    st.integers(min_value=-(10**40), max_value=10**300).map(str),
    st.tuples(st.text(alphabet=sorted(_GO_IS_SPACE), max_size=3), _TRICKY,
              st.text(alphabet=sorted(_GO_IS_SPACE), max_size=3)).map("".join),
)


@pytest.mark.parametrize("name", [NO_RETRY, VALID_UNTIL_SECONDS, RELAX_TOPOLOGY_AFTER,
                                  MAX_RUN_DURATION_SECONDS])
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=VALUES)
@example(value="\uff11\uff15")
@example(value="+15")
@example(value="1_5")
@example(value="15\x1c")
@example(value="\x1ctrue")
@example(value="\u00a0true\u3000")
@example(value="000")
@example(value=" 0010 ")
def test_the_policy_and_the_controller_accept_the_same_values(name: str, value: str) -> None:
    params = {name: value}
    assert policy_admits(params) == controller_admits(params), (name, value)


@settings(max_examples=100, deadline=None)
@given(values=st.dictionaries(st.sampled_from([NO_RETRY, VALID_UNTIL_SECONDS, RELAX_TOPOLOGY_AFTER,
                                               MAX_RUN_DURATION_SECONDS, PROCESSOR_INSTANCE,
                                               "colour"]),
                              VALUES, max_size=3))
def test_they_agree_on_whole_parameter_maps(values: dict[str, str]) -> None:
    assert policy_admits(values) == controller_admits(values), values


def test_an_accepted_number_is_read_as_its_value() -> None:
    params = read_parameters({VALID_UNTIL_SECONDS: "\u3000007 "}, Mode.PROVISION, "x")
    assert params.values.valid_until_seconds == 7
    huge = read_parameters({VALID_UNTIL_SECONDS: "9" * 255}, Mode.PROVISION, "x")
    assert not huge.problems and huge.values.valid_until_seconds == int("9" * 255)
