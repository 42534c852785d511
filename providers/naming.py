"""Deterministic cloud tokens and resource names derived from an acquisition key.

The key itself is the controller's (:func:`controller.acquire.keys.acquisition_key`, <= 63
chars, label and tag safe), persisted on the request before any provider call. Everything
here is a pure function of that key, so a controller that crashes after a cloud call and
retries with the same key computes the very same token and the cloud deduplicates the second
call:

* :func:`aws_client_token` - the EC2 ``ClientToken`` (<= 64 ASCII chars).
* :func:`gcp_request_id` - the Compute ``requestId`` (a UUID5, never the zero UUID).
* :func:`gcp_label_value`, :func:`gcp_name_prefix`, :func:`aws_placement_group_name`,
  :func:`gcp_policy_name` - resource names derived from the key.

A new attempt (the controller gives up on one and tries again, possibly elsewhere) must use
a new attempt number: the cloud remembers a token's outcome, including a failed one.
"""

from __future__ import annotations

import hashlib
import re
import uuid

MAX_KEY_LENGTH = 63

# Fixed namespace so request ids are stable across processes, versions and machines.
MUSTER_NAMESPACE = uuid.UUID("6f1b6c53-3f0e-5b7e-9d43-5a1f0c1d2e77")

GCP_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_NOT_SLUG = re.compile(r"[^a-z0-9-]+")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def _slug(text: str, max_length: int) -> str:
    """Lowercase RFC 1035-ish fragment: letters, digits and dashes, starting with a letter."""
    cleaned = _NOT_SLUG.sub("-", text.lower()).strip("-")
    if not cleaned or not cleaned[0].isalpha():
        cleaned = ("p-" + cleaned).rstrip("-")
    return cleaned[:max_length].rstrip("-")


def aws_client_token(key: str, purpose: str = "fleet") -> str:
    """EC2 ``ClientToken`` for one call made on behalf of ``key`` (59 chars)."""
    _require_key(key)
    return f"muster-{_digest('aws', purpose, key)[:52]}"


def gcp_request_id(key: str, purpose: str = "bulk-insert") -> str:
    """Compute ``requestId``: a UUID5 of (purpose, key), never the zero UUID."""
    _require_key(key)
    return str(uuid.uuid5(MUSTER_NAMESPACE, f"{purpose}\x1f{key}"))


def gcp_label_value(value: str) -> str:
    """``value`` itself when it is a valid GCP label value, else a stable 40-char hash."""
    if GCP_LABEL_VALUE.match(value):
        return value
    return "h" + _digest("label", value)[:39]


def gcp_name_prefix(pool: str, key: str) -> str:
    """Instance name prefix for a bulkInsert ``namePattern`` (<= 39 chars, RFC 1035)."""
    _require_key(key)
    return f"{_slug(pool, 28)}-{_digest('name', key)[:10]}"


def gcp_policy_name(pool: str, key: str) -> str:
    """Name of the per-acquisition compact placement resource policy."""
    return f"{gcp_name_prefix(pool, key)}-pp"


def aws_placement_group_name(key: str) -> str:
    """Name of the per-acquisition cluster placement group (<= 255 chars)."""
    _require_key(key)
    return f"muster-{key}"


def _require_key(key: str) -> None:
    if not key:
        raise ValueError("acquisition key must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"acquisition key longer than {MAX_KEY_LENGTH} characters: {key!r}")
