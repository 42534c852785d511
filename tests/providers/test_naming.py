"""The acquisition key and the tokens and names derived from it: deterministic, within every
cloud's limits, distinct."""

from __future__ import annotations

import re
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.acquire.keys import acquisition_key
from providers.naming import (
    aws_client_token,
    aws_placement_group_name,
    gcp_label_value,
    gcp_name_prefix,
    gcp_policy_name,
    gcp_request_id,
)

uids = st.text(min_size=1, max_size=80)
pools = st.text(min_size=1, max_size=300)
K8S_UID = "6b8f2c1e-0d3a-4c55-9e1f-2a7b3c4d5e6f"


@settings(max_examples=150, deadline=None)
@given(uid=uids, attempt=st.integers(0, 10**6 - 1), group=st.integers(0, 10**6 - 1),
       pool=pools)
def test_derived_names_fit_every_cloud_limit(uid: str, attempt: int, group: int,
                                             pool: str) -> None:
    try:
        key = acquisition_key(uid, attempt, group)
    except ValueError:
        assert not any(c.isascii() and c.isalnum() for c in uid)
        return
    assert key == acquisition_key(uid, attempt, group)
    assert len(key) <= 63 and re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", key)
    assert gcp_label_value(key) == key  # usable as a label without hashing
    token = aws_client_token(key)
    assert len(token) <= 64 and token.isascii()
    assert uuid.UUID(gcp_request_id(key)).version == 5
    prefix = gcp_name_prefix(pool, key)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", prefix) and len(prefix) + 5 <= 63
    assert len(gcp_policy_name(pool, key)) <= 63
    assert len(aws_placement_group_name(key)) <= 255


def test_every_input_changes_the_key() -> None:
    base = acquisition_key(K8S_UID, 0, 0)
    assert len({
        base,
        acquisition_key(K8S_UID.replace("6b", "7c"), 0, 0),
        acquisition_key(K8S_UID, 1, 0),
        acquisition_key(K8S_UID, 0, 1),
    }) == 4
    assert aws_client_token(base) != aws_client_token(base, "reservation")
    assert gcp_request_id(base) != gcp_request_id(base, "placement-policy")


def test_keys_and_tokens_are_stable_across_processes() -> None:
    # Pinned: a controller upgraded mid-acquisition must compute the very same keys and tokens.
    assert acquisition_key(K8S_UID, 2, 1) == f"{K8S_UID}-2-1"
    assert gcp_request_id("k") == str(
        uuid.uuid5(uuid.UUID("6f1b6c53-3f0e-5b7e-9d43-5a1f0c1d2e77"), "bulk-insert\x1fk"))


def test_label_values_that_are_not_label_safe_are_hashed_stably() -> None:
    assert gcp_label_value("ok_value-1") == "ok_value-1"
    hashed = gcp_label_value("Team/ML")
    assert hashed == gcp_label_value("Team/ML") and re.fullmatch(r"[a-z0-9]{40}", hashed)


@pytest.mark.parametrize(("args", "message"), [
    (("", 0, 0), "no letter or digit"),
    (("--", 0, 0), "no letter or digit"),
    ((K8S_UID, -1, 0), "attempt"),
    ((K8S_UID, 0, 10**6), "group"),
])
def test_bad_inputs_are_refused(args: tuple[str, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        acquisition_key(*args)


def test_overlong_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="longer than 63"):
        aws_client_token("k" * 64)
