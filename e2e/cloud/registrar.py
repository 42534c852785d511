"""The cloud tier's node lifecycle: each running instance's kubelet registers its Node, and the
cloud-controller-manager deletes the Node of an instance that is gone.

One background thread polls the clouds as the CCM does (EC2 over HTTP through the tier's
endpoint; the Compute fake's instances, which are the VMs' own metadata) and writes Nodes
with the admin kubeconfig. A VM registers ``boot_seconds`` after it is first seen running
(its boot); a VM whose pool is in :attr:`Registrar.broken_pools` never registers (a
bootstrap that fails on the machine, which no API shows), and one whose pool is in
:attr:`Registrar.held_pools` registers only once the pool is taken out (a slow boot).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.kube import ApiError, KubeClient
from controller.kube.resources import NODES
from e2e.cloud.kubelet import UserDataError, decode_user_data, ec2_node, gce_node
from tests.providers.gcp_fake import FakeCompute

log = logging.getLogger(__name__)
AWS_TAG_POOL = "muster.dev/pool"
GCE_LABEL_POOL = "muster-pool"
REGISTERED_BY = "cloud-tier.muster.dev/registered-by"


@dataclass
class Registrar:
    kubeconfig: Path
    ec2: Any | None = None
    """A boto3 EC2 client of the tier's endpoint (the CCM's view of EC2)."""
    compute: FakeCompute | None = None
    gce_project: str = "muster-cloud"
    boot_seconds: float = 1.0
    poll_seconds: float = 0.5
    broken_pools: set[str] = field(default_factory=set)
    held_pools: set[str] = field(default_factory=set)
    registered: dict[str, str] = field(default_factory=dict)
    """providerID -> Node name, of the Nodes this stand-in registered."""
    problems: list[str] = field(default_factory=list)
    _seen: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        async with await KubeClient.from_kubeconfig(self.kubeconfig) as kube:
            while not self._stop.is_set():
                try:
                    await self.sync(kube)
                except Exception as exc:  # one bad poll must not end the node lifecycle
                    log.warning("cloud tier registrar: %s", exc)
                    self.problems.append(str(exc))
                await asyncio.sleep(self.poll_seconds)

    async def sync(self, kube: KubeClient) -> None:
        """One pass: register every booted VM's Node, delete the Nodes of VMs gone."""
        wanted: dict[str, dict[str, Any] | None] = {}
        if self.ec2 is not None:
            wanted.update(await asyncio.to_thread(self._ec2_nodes))
        if self.compute is not None:
            wanted.update(self._gce_nodes())
        now = time.monotonic()
        for provider_id, body in wanted.items():
            first = self._seen.setdefault(provider_id, now)
            if body is None or provider_id in self.registered or now - first < self.boot_seconds:
                continue
            body["metadata"]["annotations"][REGISTERED_BY] = "kubelet"
            try:
                await kube.create(NODES, body)
            except ApiError as exc:
                if not exc.conflict:
                    raise
            with self._lock:
                self.registered[provider_id] = body["metadata"]["name"]
        for provider_id, name in list(self.registered.items()):
            if provider_id not in wanted:
                await kube.delete(NODES, name)
                with self._lock:
                    del self.registered[provider_id]
                self._seen.pop(provider_id, None)

    def _ec2_nodes(self) -> dict[str, dict[str, Any] | None]:
        assert self.ec2 is not None
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
        )
        instances = [i for p in pages for r in p["Reservations"] for i in r["Instances"]]
        topology: dict[str, list[str]] = {}
        if instances:
            reply = self.ec2.describe_instance_topology(
                InstanceIds=[i["InstanceId"] for i in instances]
            )
            topology = {e["InstanceId"]: e.get("NetworkNodes") or [] for e in reply["Instances"]}
        out: dict[str, dict[str, Any] | None] = {}
        for instance in instances:
            zone = instance["Placement"]["AvailabilityZone"]
            provider_id = f"aws:///{zone}/{instance['InstanceId']}"
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags") or []}
            if self._skip(tags.get(AWS_TAG_POOL)) or provider_id in self.registered:
                out[provider_id] = None
                continue
            attribute = self.ec2.describe_instance_attribute(
                InstanceId=instance["InstanceId"], Attribute="userData"
            )
            try:
                user_data = decode_user_data((attribute.get("UserData") or {}).get("Value"))
                out[provider_id] = ec2_node(
                    instance, user_data, topology.get(instance["InstanceId"], [])
                )
            except UserDataError as exc:  # the VM's bootstrap fails: it never joins
                self.problems.append(f"{instance['InstanceId']}: {exc}")
                out[provider_id] = None
        return out

    def _gce_nodes(self) -> dict[str, dict[str, Any] | None]:
        assert self.compute is not None
        with self.compute.lock:
            instances = [dict(i) for i in self.compute.all_instances()]
        out: dict[str, dict[str, Any] | None] = {}
        for instance in instances:
            zone = str(instance["zone"]).rsplit("/", 1)[-1]
            provider_id = f"gce://{self.gce_project}/{zone}/{instance['name']}"
            if self._skip(instance["labels"].get(GCE_LABEL_POOL)):
                out[provider_id] = None
                continue
            try:
                out[provider_id] = gce_node(self.gce_project, instance)
            except UserDataError as exc:
                self.problems.append(f"{instance['name']}: {exc}")
                out[provider_id] = None
        return out

    def _skip(self, pool: str | None) -> bool:
        return pool in self.broken_pools or pool in self.held_pools

    def stop(self) -> None:
        self._stop.set()


@contextlib.contextmanager
def running(registrar: Registrar) -> Iterator[Registrar]:
    thread = threading.Thread(target=registrar.run, name="cloud-registrar", daemon=True)
    thread.start()
    try:
        yield registrar
    finally:
        registrar.stop()
        thread.join(timeout=10)
