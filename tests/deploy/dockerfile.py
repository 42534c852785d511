"""A small Dockerfile and .dockerignore reader for the image tests.

No Docker engine runs on the machines that test Muster, so the image is checked by reading
its Dockerfile: instructions are split the way the Dockerfile frontend splits them (comments,
backslash continuations, exec vs shell form), and build-context paths are filtered with
.dockerignore rules (last matching pattern wins, a pattern matching a parent directory
matches the files inside it, ``!`` re-includes).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str
    """Upper-cased: FROM, RUN, COPY, ..."""
    args: str
    line: int

    @property
    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction (ENTRYPOINT ["a", "b"]), else None."""
        text = self.args.strip()
        if not text.startswith("["):
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        return None

    def flags(self) -> dict[str, str]:
        """Leading ``--name=value`` flags (COPY --from=builder, RUN --mount=...)."""
        out: dict[str, str] = {}
        for token in self.args.split():
            if not token.startswith("--"):
                break
            name, _, value = token[2:].partition("=")
            out[name] = value
        return out

    def operands(self) -> list[str]:
        """The arguments after the leading flags, shell-split on whitespace."""
        tokens = self.args.split()
        while tokens and tokens[0].startswith("--"):
            tokens.pop(0)
        return tokens


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    global_args: list[Instruction]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def arg_default(self, name: str) -> str | None:
        for ins in self.global_args:
            key, _, value = ins.args.partition("=")
            if key.strip() == name:
                return value.strip().strip('"')
        return None

    def resolve(self, text: str) -> str:
        """Substitute ``${NAME}``/``$NAME`` with global ARG defaults (as FROM lines see them)."""

        def sub(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            value = self.arg_default(name)
            return value if value is not None else m.group(0)

        return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, text)


def instructions(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # comments inside a continued instruction are dropped by the frontend
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].strip())
            continue
        buf.append(stripped)
        joined = " ".join(part for part in buf if part)
        keyword, _, args = joined.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
        buf = []
    if buf:
        raise ValueError(f"line {start}: instruction ends with a dangling backslash")
    return out


def parse(path: Path) -> Dockerfile:
    global_args: list[Instruction] = []
    stages: list[Stage] = []
    for ins in instructions(path.read_text()):
        if ins.keyword == "FROM":
            parts = ins.operands()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=parts[0], name=name))
        elif not stages:
            if ins.keyword != "ARG":
                raise ValueError(f"line {ins.line}: only ARG may precede the first FROM")
            global_args.append(ins)
        else:
            stages[-1].instructions.append(ins)
    return Dockerfile(global_args, stages)


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if i < len(pattern) and pattern[i] == "/":
                out = out[:-2] + "(?:.*/)?"
                i += 1
            continue
        ch = pattern[i]
        out += {"*": "[^/]*", "?": "[^/]"}.get(ch, re.escape(ch))
        i += 1
    return re.compile(out + r"\Z")


class DockerIgnore:
    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = line[1:].strip() if negate else line
            pattern = pattern.strip("/")
            self.rules.append((negate, _pattern_regex(pattern)))

    def excluded(self, relpath: str) -> bool:
        parts = relpath.strip("/").split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        result = False
        for negate, regex in self.rules:
            if any(regex.match(p) for p in prefixes):
                result = not negate
        return result
