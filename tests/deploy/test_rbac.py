"""The shipped RBAC is exactly what Muster needs.

The API sandbox is made to enforce the rendered ``config/default`` Roles (plus
``config/rbac/fake-provider``, as e2e/kind installs them: the scenario's pool uses the fake
provider) for the controller's service-account token (403 Forbidden otherwise, as a real API
server would answer), and the controller runs a whole gang through it: plan, acquire nodes
from a fake-provider pool, keep them alive, see the pods arrive, release the nodes after the
idle TTL. The test fails if any
request the controller makes is refused (the ClusterRole is missing a verb) or if a granted
verb was never used (the ClusterRole grants more than Muster needs), unless the grant is in
UNEXERCISED with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from controller.commands import objects
from controller.config import load_config
from controller.kube import ApiError, KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    NAMESPACES,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
)
from controller.operator import Controller
from controller.runtime.leader import from_config
from sandbox import SandboxServer
from sandbox.errors import ApiError as SandboxApiError
from tests.deploy.manifests import CONFIG, ROOT, Doc, render
from tests.helpers import eventually

MUSTER_TOKEN = "muster-service-account"
NS = "team-a"

# Grants that the scenario below does not reach, each with the code path that needs it.
UNEXERCISED: dict[tuple[str, str, str], str] = {
    ("", "nodes", "get"): "providers/fake.py re-reads a node whose create hit 409 (a retry "
    "after a crash re-creates a node that already exists)",
    ("autoscaling.x-k8s.io", "provisioningrequests", "get"): "controller/reconcilers/"
    "service.py re-reads a request whose write hit 409 or 404 (Kueue deleted and recreated "
    "it, or another writer changed it); e2e/test_kueue_real.py met it under real Kueue",
    ("", "podtemplates", "get"): "controller/kueue/workloads.py reads a template whose create "
    "hit 409 (a retried create, or an earlier Workload's template of the same name) for its "
    "uid, which the request's ownerReference needs",
    ("kueue.x-k8s.io", "workloads", "get"): "controller/kueue/workloads.py re-reads a Workload "
    "after a 409 on its status write (Kueue and other check controllers write it too)",
    ("scheduling.k8s.io", "podgroups", "list"): "controller/podgroups watches gang PodGroups "
    "where scheduling.k8s.io/v1beta1 is served (Kubernetes 1.37, GenericWorkload), which the "
    "sandbox is not; e2e/test_podgroups_real.py runs it under the real RBAC authorizer",
    ("scheduling.k8s.io", "podgroups", "watch"): "as podgroups list",
    ("autoscaling.x-k8s.io", "provisioningrequests", "create"): "controller/podgroups creates "
    "one request per gang PodGroup the scheduler cannot place (real tier: "
    "e2e/test_podgroups_real.py)",
    ("autoscaling.x-k8s.io", "provisioningrequests", "delete"): "controller/podgroups deletes "
    "a PodGroup's request whose booking ended before the scheduler placed the group, to plan "
    "it again",
    ("", "podtemplates", "create"): "controller/podgroups creates the PodTemplates of a gang "
    "PodGroup's request (real tier: e2e/test_podgroups_real.py)",
    ("", "events", "patch"): "controller/kube/events.py PATCHes the count of an Event when the "
    "same event repeats (a request retrying); tests/kube/test_events.py covers it",
    ("resource.k8s.io", "resourceslices", "create"): "providers/fake.py publishes ResourceSlices "
    "only for pools whose nodeTemplate lists resourceSlices (DRA); e2e/test_dra.py covers it",
    ("authentication.k8s.io", "tokenreviews", "create"): "`muster run`'s /metrics checks each "
    "scraper's token (controller/commands/metrics_auth.py); tests/deploy/test_run_smoke.py "
    "scrapes it",
    ("authorization.k8s.io", "subjectaccessreviews", "create"): "`muster run`'s /metrics asks "
    "whether the scraper may get /metrics; tests/deploy/test_run_smoke.py scrapes it",
}
# Requests Muster makes knowing they may be refused, each with why that is fine.
TOLERATED_DENIALS: dict[tuple[str, str, str], str] = {
    ("", "namespaces", "create"): "the fake provider creates kube-node-lease only for bare "
    "API servers such as the sandbox; every real cluster has it, and the 403 is ignored",
}


@dataclass(frozen=True)
class Call:
    verb: str
    group: str
    resource: str
    """``plural`` or ``plural/subresource``."""
    namespace: str | None
    name: str | None


class Rbac:
    """RBAC evaluation of rendered (Cluster)Roles and bindings for one service account."""

    def __init__(self, docs: list[Doc], account: tuple[str, str]) -> None:
        roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
                 for d in docs if d["kind"] in ("ClusterRole", "Role")}
        self.cluster_rules: list[Doc] = []
        self.rules_by_role: dict[str, list[Doc]] = {}
        self.ns_rules: dict[str, list[Doc]] = {}
        ns, name = account
        for b in docs:
            if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
                continue
            if not any(s.get("kind") == "ServiceAccount" and s.get("name") == name
                       and s.get("namespace") == ns for s in b["subjects"]):
                continue
            ref = b["roleRef"]
            role_ns = b["metadata"].get("namespace") if ref["kind"] == "Role" else None
            rules = roles[(ref["kind"], role_ns, ref["name"])]["rules"]
            self.rules_by_role.setdefault(ref["name"], []).extend(rules)
            if b["kind"] == "ClusterRoleBinding":
                self.cluster_rules += rules
            else:
                self.ns_rules.setdefault(b["metadata"]["namespace"], []).extend(rules)

    @staticmethod
    def _match(rule: Doc, call: Call) -> bool:
        def has(key: str, value: str) -> bool:
            return value in rule.get(key, []) or "*" in rule.get(key, [])

        if "nonResourceURLs" in rule:
            return False  # the calls here are all on resources
        if not (has("apiGroups", call.group) and has("resources", call.resource)
                and has("verbs", call.verb)):
            return False
        names = rule.get("resourceNames")
        return not names or call.name in names

    def rules_for(self, call: Call) -> list[Doc]:
        rules = list(self.cluster_rules)
        if call.namespace is not None:
            rules += self.ns_rules.get(call.namespace, [])
        return rules

    def allows(self, call: Call) -> bool:
        return any(self._match(r, call) for r in self.rules_for(call))

    def grants(self, roles: set[str] | None = None) -> set[tuple[str, str, str]]:
        """(group, resource, verb) granted, by every bound role or only by ``roles``."""
        out = set()
        for name, rules in self.rules_by_role.items():
            if roles is not None and name not in roles:
                continue
            for rule in rules:
                for g in rule.get("apiGroups", []):  # nonResourceURLs rules have none
                    for res in rule.get("resources", []):
                        for v in rule["verbs"]:
                            out.add((g, res, v))
        return out


class EnforcingSandbox(SandboxServer):
    """The sandbox, refusing the controller's token what its RBAC does not allow."""

    def __init__(self, rbac: Rbac, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rbac = rbac
        self.calls: list[Call] = []
        self.denied: list[Call] = []

    def _verb(self, request: web.Request, t: Any) -> str:  # type: ignore[override]
        verb = SandboxServer._verb(request, t)
        if request.headers.get("Authorization") != f"Bearer {MUSTER_TOKEN}":
            return verb
        resource = t.rt.plural + (f"/{t.subresource}" if t.subresource else "")
        call = Call(verb, t.rt.group, resource, t.namespace, t.name)
        self.calls.append(call)
        if not self.rbac.allows(call):
            self.denied.append(call)
            raise SandboxApiError(
                403, "Forbidden",
                f'{resource}.{t.rt.group} is forbidden: User "system:serviceaccount:'
                f'muster-system:muster" cannot {verb} resource "{resource}"',
            )
        return verb


def _installed() -> list[Doc]:
    """What e2e/kind installs for the controller: config/default and the fake provider's RBAC
    (the scenarios' pools are fake-provider pools)."""
    return render(CONFIG / "default") + render(CONFIG / "rbac" / "fake-provider")


def _kubeconfig(server: SandboxServer, path: Path, token: str) -> Path:
    cfg = server.kubeconfig()
    cfg["users"][0]["user"]["token"] = token
    path.write_text(yaml.safe_dump(cfg))
    return path


@contextlib.asynccontextmanager
async def _controller(
    kube: KubeClient, kubeconfig: Path, tmp_path: Path, **extra: Any
) -> AsyncIterator[Controller]:
    settings = yaml.safe_load((CONFIG / "manager" / "muster.yaml").read_text())
    settings.update(extra)
    settings["log_format"] = "text"
    settings["booking"]["duration_seconds"] = 30
    settings["retry"].update(initial_backoff_seconds=0.2, max_backoff_seconds=1)
    settings["acquisition"].update(node_ready_timeout_seconds=10, idle_ttl_seconds=0.5)
    settings.setdefault("providers", {}).setdefault("kind", {})["heartbeat_seconds"] = 0.2
    settings["acquisition"]["collect_interval_seconds"] = 0.3
    settings["pool_status"] = {"interval_seconds": 0.3}
    # Renewals (get + patch of the Lease) happen within the scenario's seconds.
    settings["leader_election"].update(
        lease_duration_seconds=3, renew_deadline_seconds=2, retry_period_seconds=0.3)
    file = tmp_path / "muster.yaml"
    file.write_text(yaml.safe_dump(settings))
    config = load_config(file)
    # As `muster run` does: campaign for the Lease (in the pod's namespace, muster-system
    # here as no service-account file exists) on a client of its own, under the same
    # service account; start once leading, release after stopping.
    lease_kube = await KubeClient.from_kubeconfig(kubeconfig)
    elector = from_config(lease_kube, config.leader_election)
    await elector.acquire()
    # Providers come from the registry, as in `muster run`: nothing injected.
    controller = Controller(kube=kube, config=config)
    await controller.start()
    try:
        yield controller
    finally:
        try:
            await controller.stop()
            assert elector.is_leader, "the Lease was renewed throughout"
            assert await elector.release()
        finally:
            await lease_kube.close()


async def _condition(kube: KubeClient, name: str, type_: str) -> Mapping[str, Any] | None:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace=NS)
    for cond in (pr.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_ and cond.get("status") == "True":
            return dict(cond)
    return None


@pytest.mark.timeout(120)
async def test_controller_works_with_exactly_the_shipped_rbac(tmp_path: Path) -> None:
    docs = _installed()
    rbac = Rbac(docs, ("muster-system", "muster"))
    server = EnforcingSandbox(rbac, crd_dir=ROOT / "crds", bookmark_interval=0.3, seed=3)
    async with server:
        admin = await KubeClient.from_kubeconfig(_kubeconfig(server, tmp_path / "admin", "admin"))
        muster = await KubeClient.from_kubeconfig(
            _kubeconfig(server, tmp_path / "muster", MUSTER_TOKEN))
        try:
            await admin.create(NAMESPACES, {"metadata": {"name": NS}})
            await admin.create(NAMESPACES, {"metadata": {"name": "muster-system"}})
            with contextlib.suppress(ApiError):  # the sandbox may already have it
                await admin.create(NAMESPACES, {"metadata": {"name": "kube-node-lease"}})
            pool = objects.gpu_pool("gpu", blocks=1, racks_per_block=2, nodes_per_rack=4)
            await admin.create(CAPACITY_POOLS, pool)
            template = objects.pod_template(
                "workers", namespace=NS, requests={"cpu": "8", objects.GPU: "8"},
                required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION])
            await admin.create(POD_TEMPLATES, template, namespace=NS)
            async with _controller(muster, tmp_path / "muster", tmp_path):
                await admin.create(PROVISIONING_REQUESTS, objects.provisioning_request(
                    "gang", pod_sets=[("workers", 3)], namespace=NS), namespace=NS)
                await eventually(lambda: _condition(admin, "gang", "Provisioned"))
                nodes = (await admin.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]
                assert len(nodes) == 3
                # The gang's pods arrive on the new nodes (what the scheduler would do) ...
                for i, node in enumerate(nodes):
                    pod = objects.consumer_pod(f"w{i}", request="gang", template=template)
                    pod["spec"]["nodeName"] = node["metadata"]["name"]
                    await admin.create(PODS, pod, namespace=NS)
                # ... run, and finish: after the idle TTL Muster releases the nodes together.
                await asyncio.sleep(1.0)
                for i in range(len(nodes)):
                    await admin.delete(PODS, f"w{i}", namespace=NS)

                async def released() -> bool:
                    listing = await admin.list(NODES, label_selector="muster.dev/pool=gpu")
                    return not listing["items"]

                await eventually(released, within=30)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; requests refused by the RBAC: {server.denied}") from exc
        finally:
            await admin.close()
            await muster.close()

    _check_audit(server, rbac)


def test_exceptions_name_real_grants() -> None:
    rbac = Rbac(_installed() + render(CONFIG / "rbac" / "kueue"),
                ("muster-system", "muster"))
    stale = {k for k in UNEXERCISED if k not in rbac.grants()}
    assert not stale, f"UNEXERCISED names grants the RBAC no longer has: {stale}"
    wrongly_granted = {k for k in TOLERATED_DENIALS if k in rbac.grants()}
    assert not wrongly_granted, f"TOLERATED_DENIALS are granted after all: {wrongly_granted}"


def _check_audit(server: EnforcingSandbox, rbac: Rbac, roles: set[str] | None = None) -> None:
    assert server.calls, "the controller made no request under its own token"
    unexpected = [c for c in server.denied
                  if (c.group, c.resource, c.verb) not in TOLERATED_DENIALS]
    assert not unexpected, "requests the shipped RBAC refuses:\n" + "\n".join(map(str, unexpected))
    used = {(c.group, c.resource, c.verb) for c in server.calls}
    unused = rbac.grants(roles) - used - set(UNEXERCISED)
    assert not unused, f"granted but never used (drop them or explain in UNEXERCISED): {unused}"


@pytest.mark.timeout(120)
async def test_kueue_admission_check_works_with_exactly_its_rbac(tmp_path: Path) -> None:
    from controller.commands import kueue_objects as kq
    from controller.kueue.resources import (
        ADMISSION_CHECKS,
        CLUSTER_QUEUES,
        LOCAL_QUEUES,
        PROVISIONING_REQUEST_CONFIGS,
        RESOURCE_FLAVORS,
        WORKLOADS,
    )
    from sandbox.scheduler import SandboxScheduler

    docs = _installed() + render(CONFIG / "rbac" / "kueue")
    rbac = Rbac(docs, ("muster-system", "muster"))
    server = EnforcingSandbox(rbac, crd_dir=ROOT / "crds", bookmark_interval=0.3, seed=4)
    server.store.load_crd_dir(ROOT / "e2e" / "kueue-crds")
    flavors = {"workers": {"cpu": "h100", "memory": "h100", objects.GPU: "h100"}}
    async with server:
        admin = await KubeClient.from_kubeconfig(_kubeconfig(server, tmp_path / "admin", "admin"))
        muster = await KubeClient.from_kubeconfig(
            _kubeconfig(server, tmp_path / "muster", MUSTER_TOKEN))
        scheduler = SandboxScheduler(server.store)

        async def status(name: str, change: Callable[[Doc], Doc]) -> None:
            # Kueue's way: read-modify-write of the Workload status under its resourceVersion.
            wl = await admin.get(WORKLOADS, name, namespace=NS)
            await admin.merge_patch(
                WORKLOADS, name,
                {"metadata": {"resourceVersion": wl["metadata"]["resourceVersion"]},
                 "status": change(wl)}, namespace=NS, subresource="status")

        async def check_state(name: str) -> str | None:
            wl = await admin.get(WORKLOADS, name, namespace=NS)
            for entry in (wl.get("status") or {}).get("admissionChecks") or []:
                if entry["name"] == "muster-check":
                    return str(entry.get("state"))
            return None

        try:
            await admin.create(NAMESPACES, {"metadata": {"name": NS}})
            await admin.create(NAMESPACES, {"metadata": {"name": "muster-system"}})
            await admin.create(CAPACITY_POOLS, objects.gpu_pool(
                "gpu", blocks=1, racks_per_block=2, nodes_per_rack=4))
            await admin.create(RESOURCE_FLAVORS, kq.resource_flavor(
                "h100", node_labels={"muster.dev/accelerator": "h100"}))
            await admin.create(PROVISIONING_REQUEST_CONFIGS, kq.provisioning_request_config(
                "muster-atomic", class_name="atomic-provisioning.muster.dev"))
            await admin.create(ADMISSION_CHECKS, kq.admission_check(
                "muster-check", controller_name="muster.dev/provisioning",
                config="muster-atomic"))
            await admin.create(CLUSTER_QUEUES, kq.cluster_queue(
                "gpu-cq", flavors={"h100": {"cpu": "1000", "memory": "10Ti", objects.GPU: "64"}},
                checks=["muster-check"]))
            await admin.create(LOCAL_QUEUES, kq.local_queue("team", NS, "gpu-cq"), namespace=NS)
            await scheduler.start()
            async with _controller(muster, tmp_path / "muster", tmp_path,
                                   kueue={"enabled": True}):
                await admin.create(WORKLOADS, kq.workload("train", NS, queue="team", pod_sets=[
                    kq.pod_set("workers", 3,
                               requests={"cpu": "8", "memory": "64Gi", objects.GPU: "8"},
                               annotations={"muster.dev/required-topology": objects.RACK}),
                ]), namespace=NS)
                await status("train", lambda wl: kq.reserve_quota(
                    wl, cluster_queue="gpu-cq", flavors=flavors, checks=["muster-check"],
                    now=_now()))
                await eventually(lambda: _is(check_state("train"), "Ready"), within=40)
                await status("train", lambda wl: kq.set_condition(
                    wl["status"], "Admitted", True, "Admitted", _now()))
                wl = await admin.get(WORKLOADS, "train", namespace=NS)
                flavor_objs = {"h100": await admin.get(RESOURCE_FLAVORS, "h100")}
                for i in range(3):
                    await admin.create(PODS, kq.admitted_pod(wl, "workers", i,
                                                             flavors=flavor_objs), namespace=NS)
                await status("train", lambda wl: kq.set_condition(
                    wl["status"], "Finished", True, "Succeeded", _now()))

                async def requests_gone() -> bool:
                    listing = await admin.list(PROVISIONING_REQUESTS, namespace=NS)
                    return not listing["items"]

                await eventually(requests_gone, within=30)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; requests refused by the RBAC: {server.denied}") from exc
        finally:
            await scheduler.stop()
            await admin.close()
            await muster.close()
    _check_audit(server, rbac, roles={"muster-kueue"})


async def _is(value: Any, want: str) -> bool:
    return bool(await value == want)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_enforcement_refuses_what_is_not_granted() -> None:
    rbac = Rbac(_installed(), ("muster-system", "muster"))
    assert rbac.allows(Call("watch", "", "pods", None, None))
    assert rbac.allows(Call("patch", "coordination.k8s.io", "leases", "kube-node-lease", "n1"))
    assert not rbac.allows(Call("patch", "coordination.k8s.io", "leases", "default", "n1"))
    assert rbac.allows(Call("patch", "coordination.k8s.io", "leases", "muster-system", "muster"))
    assert not rbac.allows(Call("patch", "coordination.k8s.io", "leases", "muster-system",
                                "other")), "only Muster's own Lease"
    assert not rbac.allows(Call("list", "coordination.k8s.io", "leases", "muster-system", None))
    assert not rbac.allows(Call("get", "", "secrets", "muster-system", "x"))
    assert not rbac.allows(Call("delete", "", "pods", NS, "w0"))
    # Muster patches the nodes it registers (creating and deleting them is the fake
    # provider's grant, installed here too).
    assert rbac.allows(Call("patch", "", "nodes", None, "n1"))
    assert not Rbac(_installed(), ("default", "muster")).allows(
        Call("list", "", "pods", None, None)), "only the muster-system account is bound"
    # config/default alone grants no Node writes and no node Leases.
    default = Rbac(render(CONFIG / "default"), ("muster-system", "muster"))
    assert not default.allows(Call("create", "", "nodes", None, "n1"))
    assert not default.allows(Call("delete", "", "nodes", None, "n1"))
    assert not default.allows(Call("patch", "coordination.k8s.io", "leases", "kube-node-lease",
                                   "n1"))


def test_cloud_providers_hold_no_kubernetes_client() -> None:
    # docs/tasks/install.md, "RBAC per provider": the aws and gcp rows grant nothing beyond
    # config/rbac because only the fake provider (and the registry that hands it the client)
    # talks to the API server; the real tier's audit log records what the controller itself
    # calls.
    import ast

    allowed = {"__init__", "registry", "fake"}
    offenders = []
    for path in sorted((ROOT / "providers").glob("*.py")):
        if path.stem in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names
                          if n.startswith(("controller.kube", "kubernetes_asyncio"))]
    assert not offenders
