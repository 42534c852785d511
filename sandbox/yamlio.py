"""YAML loading as the apiserver sees it: JSON-compatible values only. PyYAML's safe loader
turns unquoted timestamps into ``datetime`` objects, which would not survive JSON
serialisation, so timestamps stay strings here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml


class _JsonCompatibleLoader(yaml.SafeLoader):
    pass


# Drop the timestamp resolver: "2026-01-01T00:00:00Z" stays a string, as in JSON.
_JsonCompatibleLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load(text: str | bytes) -> Any:
    return yaml.load(text, Loader=_JsonCompatibleLoader)


def load_all(text: str | bytes) -> Iterator[Any]:
    return yaml.load_all(text, Loader=_JsonCompatibleLoader)
