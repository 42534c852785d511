"""CEL device selectors (DeviceClass and request ``selectors[].cel.expression``).

The engine talks to CEL through :func:`compile_selector` and :meth:`Selector.matches` only;
the library behind it is ``cel-expr-python`` (Google's cel-cpp runtime; see
``benchmarks/cel_compare.py`` for the comparison that chose it). Pure computation: no I/O.

The ``device`` variable follows resource.k8s.io/v1:

* ``device.driver`` (string), ``device.allowMultipleAllocations`` (bool);
* ``device.attributes["<domain>"].<id>``: int, bool, string or version values; an attribute
  ``productName`` of driver ``gpu.nvidia.com`` is ``device.attributes["gpu.nvidia.com"]
  .productName``, ``resource.kubernetes.io/pcieRoot`` is ``device.attributes
  ["resource.kubernetes.io"].pcieRoot``. A domain the device has no attributes in reads as an
  empty map (so ``"x" in device.attributes["other"]`` is false), as in Kubernetes;
* ``device.capacity["<domain>"].<id>``: quantities.

Kubernetes' quantity and semver libraries are provided as functions: ``quantity(s)``,
``isQuantity(s)``, ``semver(s)``, ``isSemver(s)`` and the members ``compareTo``,
``isGreaterThan``, ``isLessThan``, ``sign``, ``add``, ``sub``, ``asInteger``,
``isInteger``, ``asApproximateFloat``, ``major``, ``minor``, ``patch``. Quantities and
versions are carried as one-key tagged maps (``{"__quantity__": <milli-units>}``,
``{"__semver__": "1.2.3"}``), so equality between two of them is value equality, while a
quantity compared with a plain number is a type error, as in Kubernetes.

Every compile or evaluation error becomes a :class:`SelectorError` whose message names the
object the expression came from and the expression itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

import cel_expr_python.cel as _cel

QUANTITY_TAG = "__quantity__"
SEMVER_TAG = "__semver__"
MAX_EXPRESSION_LENGTH = 10 * 1024
"""resource.k8s.io/v1 limit on one selector expression."""

AttributeValue = bool | int | str
"""A device attribute value; versions are :class:`SemVer`."""


class SelectorError(ValueError):
    """A selector that cannot be compiled or evaluated; the message names its origin."""


# ---------------------------------------------------------------------------- values


# Kubernetes' ParseQuantity: ASCII digits, nothing around the quantity.
_QUANTITY = re.compile(
    r"(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)
_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"), "Ki": Decimal(2**10), "Mi": Decimal(2**20),
    "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}


def quantity_milli(text: str) -> int:
    """A Kubernetes quantity in milli-units, rounded up (ValueError when malformed).

    Kept here rather than imported from ``controller.api`` so the engine depends on nothing
    outside ``controller.fit``."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"invalid quantity {text!r}")
    suffix = match.group("suffix") or ""
    try:
        number = Decimal(match.group("num"))
        value = number.scaleb(int(suffix[1:])) if suffix[:1] in ("e", "E") else (
            number * _SUFFIX[suffix]
        )
    except (InvalidOperation, ValueError) as exc:  # pragma: no cover - regex guards this
        raise ValueError(f"invalid quantity {text!r}") from exc
    return int((value * 1000).to_integral_value(rounding=ROUND_CEILING))


# ASCII digits, nothing around the version (Kubernetes' semver() parses strictly).
_SEMVER = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-((?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
    r"(?:\.(?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)


@dataclass(frozen=True, slots=True, order=False)
class SemVer:
    """A semantic version (a DRA ``version`` attribute); build metadata is ignored."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> SemVer:
        return _parse_semver(text)

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(self.pre)}" if self.pre else core

    def compare(self, other: SemVer) -> int:
        """-1, 0 or 1 by semver precedence."""
        a = (self.major, self.minor, self.patch)
        b = (other.major, other.minor, other.patch)
        if a != b:
            return -1 if a < b else 1
        if self.pre == other.pre:
            return 0
        if not self.pre:  # a release ranks above its pre-releases
            return 1
        if not other.pre:
            return -1
        for x, y in zip(self.pre, other.pre, strict=False):
            if x == y:
                continue
            xd, yd = x.isdigit(), y.isdigit()
            if xd and yd:
                return -1 if int(x) < int(y) else 1
            if xd != yd:  # numeric identifiers rank below alphanumeric ones
                return -1 if xd else 1
            return -1 if x < y else 1
        return -1 if len(self.pre) < len(other.pre) else 1


@lru_cache(maxsize=4096)
def _parse_semver(text: str) -> SemVer:
    match = _SEMVER.fullmatch(text)
    if match is None:
        raise ValueError(f"invalid semantic version {text!r}")
    pre = tuple(match.group(4).split(".")) if match.group(4) else ()
    return SemVer(int(match.group(1)), int(match.group(2)), int(match.group(3)), pre)


def _qtag(milli: int) -> dict[str, int]:
    return {QUANTITY_TAG: milli}


def _vtag(version: SemVer) -> dict[str, str]:
    return {SEMVER_TAG: str(version)}


def _kind(value: Any) -> str | None:
    if isinstance(value, Mapping) and len(value) == 1:
        if QUANTITY_TAG in value:
            return "quantity"
        if SEMVER_TAG in value:
            return "semver"
    return None


def _milli(value: Any, what: str) -> int:
    if _kind(value) == "quantity":
        return int(value[QUANTITY_TAG])
    raise ValueError(f"{what} needs a quantity, got {_describe(value)}")


def _semver(value: Any, what: str) -> SemVer:
    if _kind(value) == "semver":
        return _parse_semver(str(value[SEMVER_TAG]))
    raise ValueError(f"{what} needs a semver, got {_describe(value)}")


def _describe(value: Any) -> str:
    kind = _kind(value)
    return kind if kind else type(value).__name__


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def _compare(a: Any, b: Any) -> int:
    if _kind(a) == "semver":
        return _semver(a, "compareTo").compare(_semver(b, "compareTo"))
    return _sign(_milli(a, "compareTo") - _milli(b, "compareTo"))


def _operand_milli(value: Any, what: str) -> int:
    # Kubernetes' quantity.add/sub accept a quantity or an int (whole units).
    if isinstance(value, int) and not isinstance(value, bool):
        return value * 1000
    return _milli(value, what)


def _as_integer(q: Any) -> int:
    milli = _milli(q, "asInteger")
    if milli % 1000:
        raise ValueError("asInteger: the quantity is not a whole number")
    return milli // 1000


def _is(parse: Callable[[str], object]) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        try:
            parse(text)
        except ValueError:
            return False
        return True

    return check


def _make_quantity(text: str) -> dict[str, int]:
    return _qtag(quantity_milli(text))


def _make_semver(text: str) -> dict[str, str]:
    return _vtag(_parse_semver(text))


# name -> (is_member, parameter kinds, return kind, implementation); kinds: "m" a tagged
# map (quantity or semver), "s" string, "i" int, "b" bool, "f" double.
_FUNCTIONS: dict[str, tuple[bool, tuple[str, ...], str, Callable[..., Any]]] = {
    "quantity": (False, ("s",), "m", _make_quantity),
    "isQuantity": (False, ("s",), "b", _is(quantity_milli)),
    "semver": (False, ("s",), "m", _make_semver),
    "isSemver": (False, ("s",), "b", _is(_parse_semver)),
    "compareTo": (True, ("m", "m"), "i", _compare),
    "isGreaterThan": (True, ("m", "m"), "b", lambda a, b: _compare(a, b) > 0),
    "isLessThan": (True, ("m", "m"), "b", lambda a, b: _compare(a, b) < 0),
    "sign": (True, ("m",), "i", lambda q: _sign(_milli(q, "sign"))),
    "add": (True, ("m", "m"), "m",
            lambda a, b: _qtag(_milli(a, "add") + _operand_milli(b, "add"))),
    "sub": (True, ("m", "m"), "m",
            lambda a, b: _qtag(_milli(a, "sub") - _operand_milli(b, "sub"))),
    "asInteger": (True, ("m",), "i", _as_integer),
    "isInteger": (True, ("m",), "b", lambda q: _milli(q, "isInteger") % 1000 == 0),
    "asApproximateFloat": (True, ("m",), "f",
                           lambda q: _milli(q, "asApproximateFloat") / 1000),
    "major": (True, ("m",), "i", lambda v: _semver(v, "major").major),
    "minor": (True, ("m",), "i", lambda v: _semver(v, "minor").minor),
    "patch": (True, ("m",), "i", lambda v: _semver(v, "patch").patch),
}
"""Kubernetes' CEL quantity and semver libraries over the tagged-map representation.
Shared with ``benchmarks/cel_compare.py`` so every library is measured on the same
semantics. ``add``/``sub`` also take an int (whole units), as in Kubernetes."""

INT_OPERAND = frozenset({"add", "sub"})


def library_functions() -> dict[str, tuple[bool, tuple[str, ...], str, Callable[..., Any]]]:
    return dict(_FUNCTIONS)


# ---------------------------------------------------------------------------- the device


_DOMAIN_LITERAL = re.compile(r'device\s*\.\s*(?:attributes|capacity)\s*\[\s*"([^"\\]*)"\s*\]')


def split_name(qualified: str, driver: str) -> tuple[str, str]:
    """``resource.kubernetes.io/pcieRoot`` -> (domain, id); unprefixed names belong to the
    driver's domain."""
    domain, sep, ident = qualified.rpartition("/")
    return (domain, ident) if sep else (driver, qualified)


def device_value(
    driver: str,
    attributes: Mapping[str, AttributeValue | SemVer],
    capacity: Mapping[str, int],
    allow_multiple: bool,
) -> dict[str, Any]:
    """The CEL ``device`` variable. ``capacity`` is in base units (bytes, counts)."""
    attrs: dict[str, dict[str, Any]] = {}
    for name, value in attributes.items():
        domain, ident = split_name(name, driver)
        attrs.setdefault(domain, {})[ident] = _vtag(value) if isinstance(value, SemVer) else value
    caps: dict[str, dict[str, Any]] = {}
    for name, amount in capacity.items():
        domain, ident = split_name(name, driver)
        caps.setdefault(domain, {})[ident] = _qtag(amount * 1000)
    return {
        "driver": driver,
        "attributes": attrs,
        "capacity": caps,
        "allowMultipleAllocations": allow_multiple,
    }


# ---------------------------------------------------------------------------- compiling


def _cel_type(kind: str) -> Any:
    return {
        "m": _cel.Type.MAP, "s": _cel.Type.STRING, "i": _cel.Type.INT, "b": _cel.Type.BOOL,
        "f": _cel.Type.DOUBLE,
    }[kind]


def _wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except (ValueError, TypeError, KeyError, ZeroDivisionError) as exc:
            # Reported by the runtime as an evaluation error of the expression.
            raise RuntimeError(str(exc)) from exc

    return call


@lru_cache(maxsize=1)
def _env() -> Any:
    from cel_expr_python.ext import ext_bindings

    decls = []
    for name, (member, params, ret, impl) in _FUNCTIONS.items():
        signatures = [params]
        if name in INT_OPERAND:
            signatures.append((params[0], "i"))
        overloads = [
            _cel.Overload(
                f"muster_{name}_{'_'.join(sig)}",
                _cel_type(ret),
                [_cel_type(k) for k in sig],
                is_member=member,
                impl=_wrap(impl),
            )
            for sig in signatures
        ]
        decls.append(_cel.FunctionDecl(name, overloads))
    return _cel.NewEnv(
        variables={"device": _cel.Type.DYN},
        functions=decls,
        extensions=[ext_bindings.ExtBindings()],
    )


@dataclass(frozen=True, slots=True, eq=False)
class Selector:
    """One compiled CEL selector and the object it came from (for messages)."""

    expression: str
    origin: str
    """e.g. ``DeviceClass gpu.nvidia.com`` or ``ResourceClaimTemplate ns/t request gpu``."""
    domains: tuple[str, ...]
    """Domains the expression names literally; the device variable gets an empty map for
    each one the device lacks."""
    program: Any
    names: frozenset[str] | None = None
    """Every identifier and string literal of the expression: the attributes it can read,
    or None when it may read attributes it does not name (iteration, dynamic index)."""

    def matches(self, device: Mapping[str, Any]) -> bool:
        """Evaluate on a :func:`device_value`; SelectorError on a runtime error or a
        non-boolean result."""
        dev: Mapping[str, Any] = device
        if self.domains:
            attrs, caps = device["attributes"], device["capacity"]
            if any(d not in attrs or d not in caps for d in self.domains):
                dev = {
                    **device,
                    "attributes": {**{d: {} for d in self.domains}, **attrs},
                    "capacity": {**{d: {} for d in self.domains}, **caps},
                }
        try:
            value = self.program.eval(data={"device": dev})
        except Exception as exc:  # the runtime raises for failures of its own
            raise self.error(f"evaluation failed: {exc}") from exc
        if value.type() == _cel.Type.ERROR:
            raise self.error(f"evaluation failed: {value.value()}")
        result = value.value()
        if not isinstance(result, bool):
            raise self.error(f"must evaluate to a bool, got {value.type().name()}")
        return result

    def error(self, problem: str) -> SelectorError:
        return SelectorError(f"{self.origin}: CEL selector {self.expression!r}: {problem}")


def compile_selector(expression: str, origin: str) -> Selector:
    """Compile once per (expression, origin); SelectorError names the origin."""
    return _compile(expression, origin)


@lru_cache(maxsize=4096)
def _compile(expression: str, origin: str) -> Selector:
    program = _compile_text(expression)
    if isinstance(program, str):
        raise SelectorError(f"{origin}: CEL selector {expression!r}: {program}")
    domains = tuple(sorted(set(_DOMAIN_LITERAL.findall(expression))))
    return Selector(expression, origin, domains, program, referenced_names(expression))


_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\'')
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAP_ACCESS = re.compile(r"device\s*\.\s*(?:attributes|capacity)\b")
_LITERAL_INDEX = re.compile(r'\s*\[\s*"[^"\\]*"\s*\]')
_FIELD = re.compile(r"\s*\.\s*[A-Za-z_][A-Za-z0-9_]*\b(?!\s*\()")
_IN_BEFORE = re.compile(r"\bin\s*$")


def referenced_names(expression: str) -> frozenset[str] | None:
    """Names an expression can read device attributes by, or None if it may read others.

    Sound for the usual selector forms: an attribute is read by ``.name``, ``["name"]`` or
    ``"name" in``, so every attribute the expression reads is named in it, unless a domain
    map is iterated, passed around or indexed dynamically (then None)."""
    stripped = _STRING.sub('""', expression)
    if re.search(r"\[(?!\s*\"\")", stripped):
        return None  # an index that is not a string literal
    for m in _MAP_ACCESS.finditer(expression):
        rest = expression[m.end():]
        index = _LITERAL_INDEX.match(rest)
        if index is None:
            return None  # the whole attributes/capacity map is used
        after = rest[index.end():]
        if _FIELD.match(after) or _LITERAL_INDEX.match(after):
            continue
        if _IN_BEFORE.search(expression[: m.start()]):
            continue  # "name" in device.attributes["domain"]
        return None
    names = {a or b for a, b in _STRING.findall(expression)}
    names.update(_IDENT.findall(stripped))
    return frozenset(names)


@lru_cache(maxsize=4096)
def _compile_text(expression: str) -> Any:
    """The compiled program, or the error text (cached by text, shared across origins)."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        return f"longer than {MAX_EXPRESSION_LENGTH} characters"
    if not expression.strip():
        return "empty expression"
    try:
        return _env().compile(expression)
    except Exception as exc:  # cel-cpp reports parse/check errors as RuntimeError
        return "does not compile: " + " ".join(str(exc).split())
