"""Label and field selectors with the syntax of the Kubernetes API (``labelSelector`` and
``fieldSelector`` query parameters), compiled once per request and matched per object."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandbox.errors import bad_request

Obj = Mapping[str, Any]

_LABEL_TOKEN = re.compile(r"[A-Za-z0-9_.\-/]*")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # "!=" and "notin" match objects without the label, as on a real server.
        return not present or labels[self.key] not in self.values


class LabelSelector:
    """A parsed ``labelSelector``: every requirement must hold (logical AND)."""

    def __init__(self, requirements: list[Requirement]) -> None:
        self.requirements = requirements
        # Equality requirements let callers narrow candidates via indexes, if they have any.
        self.equalities = {
            r.key: next(iter(r.values)) for r in requirements
            if r.op == "=" and len(r.values) == 1
        }

    def __bool__(self) -> bool:
        return bool(self.requirements)

    def matches(self, obj: Obj) -> bool:
        if not self.requirements:
            return True
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.matches(labels) for r in self.requirements)

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        if not text or not text.strip():
            return cls([])
        return cls(_LabelParser(text).parse())

    @classmethod
    def from_dict(cls, selector: Mapping[str, Any] | None) -> LabelSelector:
        """A metav1.LabelSelector (``matchLabels`` and ``matchExpressions``)."""
        if not selector:
            return cls([])
        reqs = [
            Requirement(k, "=", frozenset([str(v)]))
            for k, v in (selector.get("matchLabels") or {}).items()
        ]
        ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
        for expr in selector.get("matchExpressions") or []:
            op = ops.get(expr.get("operator", ""))
            if op is None:
                raise bad_request(f"unknown label selector operator {expr.get('operator')!r}")
            reqs.append(Requirement(expr["key"], op, frozenset(expr.get("values") or ())))
        return cls(reqs)


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1

    def _token(self) -> str:
        self._skip()
        m = _LABEL_TOKEN.match(self.text, self.pos)
        assert m is not None  # the pattern matches the empty string
        self.pos = m.end()
        return m.group(0)

    def _error(self, why: str) -> Exception:
        return bad_request(f"unable to parse requirement: {why} in label selector {self.text!r}")

    def _peek(self, s: str) -> bool:
        self._skip()
        return self.text.startswith(s, self.pos)

    def parse(self) -> list[Requirement]:
        reqs: list[Requirement] = []
        while True:
            reqs.append(self._requirement())
            self._skip()
            if self.pos >= len(self.text):
                return reqs
            if not self._peek(","):
                raise self._error(f"unexpected {self.text[self.pos:]!r}")
            self.pos += 1

    def _requirement(self) -> Requirement:
        if self._peek("!"):
            self.pos += 1
            key = self._token()
            if not key:
                raise self._error("missing key after '!'")
            return Requirement(key, "!exists")
        key = self._token()
        if not key:
            raise self._error("missing key")
        self._skip()
        for op in ("==", "!=", "="):
            if self.text.startswith(op, self.pos):
                self.pos += len(op)
                value = self._token()
                return Requirement(key, "!=" if op == "!=" else "=", frozenset([value]))
        save = self.pos
        word = self._token()
        if word in ("in", "notin"):
            return Requirement(key, word, self._set())
        self.pos = save
        if self.pos >= len(self.text) or self._peek(","):
            return Requirement(key, "exists")
        raise self._error(f"unexpected {self.text[self.pos:]!r} after key {key!r}")

    def _set(self) -> frozenset[str]:
        if not self._peek("("):
            raise self._error("expected '(' after set operator")
        self.pos += 1
        values: set[str] = set()
        while True:
            value = self._token()
            if value:
                values.add(value)
            if self._peek(","):
                self.pos += 1
                continue
            if self._peek(")"):
                self.pos += 1
                return frozenset(values)
            raise self._error("expected ',' or ')' in value set")


def _field_string(raw: Any) -> str:
    if raw is None:
        return ""
    return str(raw).lower() if isinstance(raw, bool) else str(raw)


def get_path(obj: Obj, dotted: str) -> Any:
    """The value at a dotted path (``spec.nodeName``), or None when any step is missing."""
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    path: str
    value: str
    negate: bool


class FieldSelector:
    """A parsed ``fieldSelector`` (``=``, ``==``, ``!=`` on any dotted field path).

    A real server only accepts a per-type list of fields (``metadata.name``,
    ``metadata.namespace``, ``spec.nodeName``, ``status.phase`` for pods ...); the sandbox accepts
    any path and compares its string form, treating a missing field as the empty string.
    """

    def __init__(self, requirements: list[FieldRequirement]) -> None:
        self.requirements = requirements

    def __bool__(self) -> bool:
        return bool(self.requirements)

    def value_for(self, path: str) -> str | None:
        """The required value of ``path`` when the selector pins it with ``=``."""
        for r in self.requirements:
            if r.path == path and not r.negate:
                return r.value
        return None

    def matches(self, obj: Obj) -> bool:
        for r in self.requirements:
            actual = _field_string(get_path(obj, r.path))
            if (actual == r.value) == r.negate:
                return False
        return True

    @classmethod
    def parse(cls, text: str | None) -> FieldSelector:
        if not text or not text.strip():
            return cls([])
        reqs: list[FieldRequirement] = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            for op in ("!=", "==", "="):
                if op in part:
                    path, _, value = part.partition(op)
                    path = path.strip()
                    if not path:
                        raise bad_request(f"invalid field selector {text!r}: missing field")
                    reqs.append(FieldRequirement(path, value.strip(), op == "!="))
                    break
            else:
                raise bad_request(
                    f"invalid selector: {part!r}; can't understand {part!r}"
                )
        return cls(reqs)


def matcher(labels: LabelSelector, fields: FieldSelector) -> Callable[[Obj], bool] | None:
    """One predicate for both selectors, or None when neither filters anything."""
    if not labels and not fields:
        return None
    if not fields:
        return labels.matches
    if not labels:
        return fields.matches
    return lambda obj: labels.matches(obj) and fields.matches(obj)
