"""Which Kubernetes rights Muster used on the real control plane, from the API server's audit log.

``e2e/cluster.py`` starts kube-apiserver with an audit policy that records, at Metadata level,
every request of a ServiceAccount in ``muster-system``. This module reads that log and compares
what Muster's ServiceAccount did with what the shipped RBAC grants (``config/rbac`` and its
``fake-provider`` and ``kueue`` parts): a request outside the grants was refused by the real
authorizer (the tier fails on it), and a grant never used is either reached only by a path the
run did not take or more than Muster needs (``tests/deploy/test_rbac.py`` keeps the reasons).

    python3 -m e2e.rbac_audit [--log .cluster/logs/audit.log]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import MUSTER_NAMESPACE, MUSTER_SA, ROOT, default_cluster

MUSTER_USER = f"system:serviceaccount:{MUSTER_NAMESPACE}:{MUSTER_SA}"
MUSTER_AGENTS = ("muster/",)
"""The controller's own requests (controller/kube/client.py USER_AGENT); a
test that acts as Muster's ServiceAccount to probe what it is refused sends another agent."""
RBAC_PARTS = ("rbac", "rbac/fake-provider", "rbac/kueue")


@dataclass(frozen=True, order=True)
class Right:
    """One (API group, resource[/subresource], verb), cluster-wide or in one namespace."""

    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        return f"{self.group or 'core'}/{self.resource} {self.verb}"


@dataclass(frozen=True)
class Usage:
    used: dict[Right, int]
    refused: dict[Right, int]


def read(log: Path, user: str = MUSTER_USER, *, since: int = 0,
         agents: tuple[str, ...] = MUSTER_AGENTS,
         restarts: Iterable[float] = (), grace: float = 90.0) -> Usage:
    """Counts of the user's resource requests in the audit log (from byte ``since``: a kept
    cluster's log holds earlier sessions too), allowed and refused. A refusal within
    ``grace`` seconds after one of ``restarts`` (the API server stopped and started again,
    epoch seconds) counts as used: its authorizer refuses until its caches synced."""
    windows = [(t, t + grace) for t in restarts]
    used: dict[Right, int] = {}
    refused: dict[Right, int] = {}
    if not log.exists():
        return Usage(used, refused)
    with log.open(encoding="utf-8") as lines:
        if since and since <= log.stat().st_size:
            lines.seek(since)
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut by log rotation
            if (event.get("user") or {}).get("username") != user:
                continue
            if not str(event.get("userAgent", "")).startswith(agents):
                continue
            ref = event.get("objectRef")
            if not ref:
                continue  # a non-resource URL (discovery, /version)
            resource = ref.get("resource", "")
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            right = Right(ref.get("apiGroup", ""), resource, event.get("verb", ""))
            # Refused by the authorizer, not by admission: a 403 the authorizer allowed is
            # e.g. NamespaceLifecycle refusing an Event in a namespace being deleted.
            decision = (event.get("annotations") or {}).get("authorization.k8s.io/decision")
            code = (event.get("responseStatus") or {}).get("code", 200)
            target = refused if code == 403 and decision != "allow" else used
            if target is refused and windows and _within(event, windows):
                target = used
            target[right] = target.get(right, 0) + 1
    return Usage(used, refused)


def _within(event: dict[str, Any], windows: list[tuple[float, float]]) -> bool:
    stamp = str(event.get("requestReceivedTimestamp") or "")
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return False
    return any(lo <= when <= hi for lo, hi in windows)


def _rules(docs: Iterable[dict[str, Any]]) -> Iterator[Right]:
    for doc in docs:
        if doc.get("kind") not in ("ClusterRole", "Role"):
            continue
        for rule in doc.get("rules") or []:
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        yield Right(group, resource, verb)


def granted(root: Path = ROOT) -> set[Right]:
    """Every right the shipped Roles and ClusterRoles grant (resourceNames set aside)."""
    rights: set[Right] = set()
    for part in RBAC_PARTS:
        folder = root / "config" / part
        for path in sorted(folder.glob("*.yaml")):
            if path.name == "kustomization.yaml":
                continue
            rights.update(_rules(d for d in yaml.safe_load_all(path.read_text()) if d))
    return rights


def report(usage: Usage, grants: set[Right]) -> list[str]:
    lines = [f"rbac (real): Muster's ServiceAccount used {len(usage.used)} of "
             f"{len(grants)} granted rights ({sum(usage.used.values())} requests)"]
    for right in sorted(usage.refused):
        lines.append(f"  refused: {right} ({usage.refused[right]}x)")
    unused = sorted(grants - set(usage.used))
    if unused:
        lines.append("  granted, not used in this run: " + ", ".join(map(str, unused)))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m e2e.rbac_audit",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, default=default_cluster().audit_log)
    parser.add_argument("--json", action="store_true", help="used rights with counts as JSON")
    args = parser.parse_args(argv)
    if not args.log.exists():
        print(f"rbac_audit: no audit log at {args.log} (start the cluster: "
              "python3 -m e2e.cluster up)", file=sys.stderr)
        return 2
    usage = read(args.log)
    if args.json:
        print(json.dumps({str(r): n for r, n in sorted(usage.used.items())}, indent=2))
    else:
        print("\n".join(report(usage, granted())))
        for right, count in sorted(usage.used.items()):
            print(f"  {right}: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
