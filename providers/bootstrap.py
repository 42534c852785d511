"""Muster's startup taint in a node's bootstrap, without the user adding kubelet flags.

EKS AL2023 nodes boot with nodeadm, which reads the user data as MIME multi-part and merges
every ``application/node.eks.aws`` part (a ``NodeConfig``) in order; a controller can
therefore append its own part after the user's, as Karpenter does. :func:`merge_nodeadm`
appends one ``NodeConfig`` whose ``spec.kubelet.flags`` registers the Node behind
``muster.dev/unregistered:NoExecute``
(:data:`controller.common.topology_defaults.UNREGISTERED_TAINT`).
User data nodeadm cannot read (a shell script for the AL2 ``bootstrap.sh``, anything else)
is refused with :class:`BootstrapError` saying what is missing, so the pool's status can
say it before anything is bought. Pure: text in, text out.
"""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage

from controller.common.topology_defaults import UNREGISTERED_TAINT

NODEADM_CONTENT_TYPE = "application/node.eks.aws"
STARTUP_TAINT_FLAG = f"--register-with-taints={UNREGISTERED_TAINT}=:NoExecute"
BOUNDARY = "//MUSTER-BOUNDARY"


class BootstrapError(ValueError):
    """The user data cannot carry Muster's startup taint; the message says what is missing."""


def startup_taint_nodeconfig() -> str:
    """The ``NodeConfig`` part Muster appends (merged by nodeadm after the user's)."""
    return (
        "apiVersion: node.eks.aws/v1alpha1\n"
        "kind: NodeConfig\n"
        "spec:\n"
        "  kubelet:\n"
        "    flags:\n"
        f'      - "{STARTUP_TAINT_FLAG}"\n'
    )


def merge_nodeadm(user_data: str) -> str:
    """``user_data`` (decoded, as a launch template holds it) with Muster's ``NodeConfig``
    part appended: MIME multi-part stays so with one more part; a bare ``NodeConfig`` becomes
    the first part of a new multi-part document. Idempotent."""
    if STARTUP_TAINT_FLAG in user_data:
        return user_data
    text = user_data.lstrip()
    if text.startswith("MIME-Version") or text.startswith("Content-Type"):
        message = email.message_from_string(user_data, policy=email.policy.default)
        if not message.is_multipart():
            raise BootstrapError("the launch template's user data is MIME but not multi-part; "
                                 "nodeadm's user data is multipart/mixed")
        if not any(p.get_content_type() == NODEADM_CONTENT_TYPE for p in message.iter_parts()):
            raise BootstrapError(
                f"the launch template's user data has no {NODEADM_CONTENT_TYPE} part: not an "
                "EKS AL2023 (nodeadm) bootstrap; add the NodeConfig with spec.cluster, or add "
                f"{STARTUP_TAINT_FLAG} to the node's kubelet yourself"
            )
        assert isinstance(message, EmailMessage)
        message.attach(_part(startup_taint_nodeconfig()))
        return message.as_string()
    if text.startswith("apiVersion: node.eks.aws/"):
        out = EmailMessage()
        out.make_mixed()
        out.set_boundary(BOUNDARY)
        out.attach(_part(user_data))
        out.attach(_part(startup_taint_nodeconfig()))
        return out.as_string()
    if text.startswith("#!"):
        raise BootstrapError(
            "the launch template's user data is a shell script (AL2 bootstrap.sh or custom), "
            "which Muster cannot extend safely; use an EKS AL2023 (nodeadm) NodeConfig, or "
            f"pass --kubelet-extra-args '{STARTUP_TAINT_FLAG}' to bootstrap.sh"
        )
    raise BootstrapError(
        "the launch template has no user data nodeadm reads (MIME multi-part with a "
        f"{NODEADM_CONTENT_TYPE} NodeConfig part): nodes would not join the cluster"
    )


def _part(body: str) -> EmailMessage:
    part = EmailMessage()
    part.set_content(body)
    part.replace_header("Content-Type", f'{NODEADM_CONTENT_TYPE}; charset="us-ascii"')
    return part
