"""Muster's startup taint merged into a stock EKS AL2023 (nodeadm) user data."""

from __future__ import annotations

import email

import pytest

from providers.bootstrap import (
    NODEADM_CONTENT_TYPE,
    STARTUP_TAINT_FLAG,
    BootstrapError,
    merge_nodeadm,
)

NODECONFIG = """apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  cluster:
    name: my-cluster
    apiServerEndpoint: https://example.com
    certificateAuthority: Y2E=
    cidr: 10.100.0.0/16
"""
STOCK = f"""MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="BOUNDARY"

--BOUNDARY
Content-Type: {NODEADM_CONTENT_TYPE}

{NODECONFIG}
--BOUNDARY--
"""


def _parts(text: str) -> list[tuple[str, str]]:
    message = email.message_from_string(text)
    return [(p.get_content_type(), str(p.get_payload())) for p in message.walk()
            if not p.is_multipart()]


def test_a_stock_nodeadm_user_data_gets_muster_s_nodeconfig_after_the_user_s() -> None:
    merged = merge_nodeadm(STOCK)
    parts = _parts(merged)
    assert [t for t, _ in parts] == [NODEADM_CONTENT_TYPE, NODEADM_CONTENT_TYPE]
    assert "my-cluster" in parts[0][1] and STARTUP_TAINT_FLAG in parts[1][1]
    assert merge_nodeadm(merged) == merged


def test_a_bare_nodeconfig_becomes_multipart() -> None:
    parts = _parts(merge_nodeadm(NODECONFIG))
    assert [t for t, _ in parts] == [NODEADM_CONTENT_TYPE, NODEADM_CONTENT_TYPE]
    assert "my-cluster" in parts[0][1] and STARTUP_TAINT_FLAG in parts[1][1]


@pytest.mark.parametrize(("user_data", "says"), [
    ("#!/bin/bash\n/etc/eks/bootstrap.sh my-cluster\n", "bootstrap.sh"),
    ("", "no user data nodeadm reads"),
    ("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"B\"\n\n--B\n"
     "Content-Type: text/x-shellscript\n\n#!/bin/bash\necho hi\n--B--\n",
     NODEADM_CONTENT_TYPE),
])
def test_user_data_muster_cannot_extend_says_what_is_missing(user_data: str, says: str) -> None:
    with pytest.raises(BootstrapError, match=says):
        merge_nodeadm(user_data)
