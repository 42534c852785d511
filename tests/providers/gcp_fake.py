"""A small Compute Engine REST fake on 127.0.0.1 for the GCP provider tests.

It speaks the wire format the google-cloud-compute REST transport uses (camelCase JSON,
int64 as strings, errors as ``{"error": {"code", "message", "errors": [{"reason"}]}}``)
and models what the provider relies on: bulkInsert all-or-nothing against a per-zone
stock, ``requestId`` deduplication, name patterns, label filters with paging, operations
that stay RUNNING for a configurable number of polls, deletes, and resource policies that
cannot be deleted while a VM uses them.

Specific reservations (``add_reservation``), optionally split into blocks: a bulkInsert
whose reservationAffinity names one (SPECIFIC_RESERVATION, key
compute.googleapis.com/reservation-name, ``name`` or ``name/reservationBlocks/block``)
draws only from that reservation's or block's free VMs, all or nothing, and fails its
operation with ZONE_RESOURCE_POOL_EXHAUSTED when they are too few (which code a real
reservation's shortfall ends with is not known here) or RESOURCE_NOT_FOUND when it names
none; reservations.get and reservationBlocks.get report the in-use counts. Not simulated:
machine-type/accelerator matching against the reservation's instance properties, shared
reservations' project permissions, sub-blocks, and where inside a block VMs land.

Flex-start resize requests of a zonal MIG (insert with name, exactly one of resizeBy and
instances (named VMs: RFC 1035 names, unique, none existing), requestedRunDuration 10
minutes to 7 days; get; list; cancel only while ACCEPTED; delete only once not
ACCEPTED/CREATING). A request stays ACCEPTED until it is granted, all its VMs at once, as
MIG members built from the MIG's template (``mig_templates``: machine type, labels and
metadata, none of Muster's) and named as the request named them (else ``<mig>-####``): by
a test calling ``grant``, or on its own (``grant_after_polls``) once it was read that many
times while the zone's stock holds all of it, reporting CREATING for one read and
SUCCEEDED from the next.
The MIG: ``listManagedInstances`` (paged) lists its members, ``deleteInstances`` deletes
members and lowers its size (a name not a member is refused unless
skipInstancesOnValidationError), and a member deleted with a plain ``instances.delete`` is
created again (the MIG keeps its target size). ``instances.get`` reads one VM. Not
simulated: the run duration's expiry (the MIG deleting the VMs), the queue's own timeout,
a resize request's partial states (CREATING is all or nothing here as there), and where in
the zone the queue puts the VMs beyond ``host_topology``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

BASE = "/compute/v1/projects/"
_FILTER = re.compile(r'labels\.([a-z0-9_-]+)\s*=\s*"?([^"\s)]*)"?')


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any


@dataclass
class Injected:
    """A synchronous HTTP error returned by the next request matching ``action``."""

    action: str
    status: int
    reason: str
    times: int = 1


@dataclass
class FakeCompute:
    stock: dict[str, int] = field(default_factory=dict)
    """zone -> how many VMs may exist there; absent = unlimited."""
    polls_before_done: int = 0
    """Each new operation reports RUNNING for this many polls."""
    page_size: int = 500
    host_topology: bool = False
    """Report ``resourceStatus.physicalHostTopology`` as A3/A4 machine types do: one block
    per zone, one sub-block per placement (the request's resource policy, else the request),
    one host per VM."""
    operation_error: str | None = None
    """Error code the next bulkInsert operation ends with (e.g. QUOTA_EXCEEDED)."""
    instances: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """zone -> name -> instance JSON."""
    policies: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    reservations: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """zone -> name -> reservation JSON (specificReservation.count; the in-use counts are
    computed from ``consumed``)."""
    blocks: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    """(zone, reservation) -> block name -> how many VMs the block holds."""
    consumed: dict[tuple[str, str], tuple[str, str | None]] = field(default_factory=dict)
    """(zone, instance) -> (reservation, block) it runs in."""
    resize_requests: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    """(zone, instance group manager, name) -> resize request JSON (queued flex-start)."""
    grant_after_polls: int | None = None
    """Grant an ACCEPTED resize request on its own once it was read this many times and
    the zone's stock holds it (None: only ``grant`` does)."""
    mig_templates: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(zone, instance group manager) -> what its instance template gives every VM
    (``machineType``, ``labels``, ``metadata`` as a dict); absent: an a3-highgpu-8g
    without labels or metadata."""
    mig_members: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    """(zone, instance group manager) -> names of its VMs."""
    requests: list[Recorded] = field(default_factory=list)
    injected: list[Injected] = field(default_factory=list)
    _request_ids: dict[str, str] = field(default_factory=dict)
    _reads: dict[tuple[str, str, str], int] = field(default_factory=dict)
    _pending_polls: dict[str, int] = field(default_factory=dict)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1000))
    lock: threading.Condition = field(default_factory=threading.Condition)

    # ---- helpers for tests ------------------------------------------------------------

    def calls(self, action: str) -> list[Recorded]:
        return [r for r in self.requests if _action(r.method, r.path) == action]

    def wait_for_calls(self, action: str, count: int, timeout: float = 10.0) -> bool:
        """Block until ``count`` requests of ``action`` arrived (for tests that must act
        while a call is in flight)."""
        with self.lock:
            return self.lock.wait_for(lambda: len(self.calls(action)) >= count, timeout)

    def all_instances(self) -> list[dict[str, Any]]:
        return [i for zone in self.instances.values() for i in zone.values()]

    def add_reservation(self, zone: str, name: str, count: int,
                        blocks: dict[str, int] | None = None) -> None:
        """A specific reservation (specificReservationRequired) of ``count`` VMs, split into
        ``blocks`` when given (their sizes must add up to ``count``)."""
        assert blocks is None or sum(blocks.values()) == count
        self.reservations.setdefault(zone, {})[name] = {
            "kind": "compute#reservation", "name": name, "status": "READY",
            "specificReservationRequired": True,
            "specificReservation": {"count": str(count)},
            "zone": f"https://compute.googleapis.com/compute/v1/projects/p/zones/{zone}",
        }
        if blocks:
            self.blocks[(zone, name)] = dict(blocks)

    def in_use(self, zone: str, name: str, block: str | None = None) -> int:
        return sum(1 for (z, _), (r, b) in self.consumed.items()
                   if z == zone and r == name and (block is None or b == block))

    def grant(self, zone: str, mig: str, name: str) -> None:
        """The queue grants a resize request: all its VMs at once, in the MIG, SUCCEEDED."""
        found = self.resize_requests[(zone, mig, name)]
        existing = self.instances.setdefault(zone, {})
        names = ([i["name"] for i in found["instances"]] if "instances" in found
                 else _names(f"{mig}-####", int(found["resizeBy"]), existing))
        for vm in names:
            self._mig_vm(zone, mig, vm, placement=name)
        found["state"] = "SUCCEEDED"

    def _mig_vm(self, zone: str, mig: str, vm: str, *, placement: str) -> None:
        template = self.mig_templates.get((zone, mig), {})
        machine = template.get("machineType", "a3-highgpu-8g")
        instance: dict[str, Any] = {
            "kind": "compute#instance", "id": str(next(self._ids)), "name": vm,
            "status": "PROVISIONING", "labels": dict(template.get("labels") or {}),
            "metadata": {"items": [
                *({"key": k, "value": v} for k, v in sorted(
                    (template.get("metadata") or {}).items())),
                {"key": "created-by",
                 "value": f"zones/{zone}/instanceGroupManagers/{mig}"}]},
            "resourcePolicies": [],
            "machineType": f"https://compute.googleapis.com/compute/v1/projects/p/zones/"
                           f"{zone}/machineTypes/{machine}",
            "zone": f"https://compute.googleapis.com/compute/v1/projects/p/zones/{zone}"}
        if self.host_topology:
            instance["resourceStatus"] = {"physicalHostTopology": {
                "block": _digest(zone), "subblock": _digest(zone, mig, placement),
                "host": _digest(zone, mig, vm)}}
        self.instances.setdefault(zone, {})[vm] = instance
        self.mig_members.setdefault((zone, mig), set()).add(vm)

    def mig_vms(self, zone: str, mig: str) -> list[str]:
        return sorted(self.mig_members.get((zone, mig), ()))

    def inject(self, action: str, status: int, reason: str, times: int = 1) -> None:
        self.injected.append(Injected(action, status, reason, times))

    # ---- request handling (called with the lock held) ---------------------------------

    def handle(self, method: str, url: str, body: Any) -> tuple[int, Any]:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        self.requests.append(Recorded(method, parts.path, query, body))
        action = _action(method, parts.path)
        for injected in self.injected:
            if injected.action == action and injected.times > 0:
                injected.times -= 1
                return _error(injected.status, injected.reason)
        if not parts.path.startswith(BASE):
            return _error(404, "notFound")
        segments = parts.path[len(BASE):].split("/")
        project, _scope, where, *rest = segments
        handler = getattr(self, f"_{action}", None)
        if handler is None:
            return _error(404, "notFound")
        result: tuple[int, Any] = handler(project, where, rest, query, body)
        return result

    def _operation(self, project: str, scope: str, where: str, kind: str,
                   target: str, error: dict[str, Any] | None = None,
                   http_status: int = 0) -> dict[str, Any]:
        name = f"operation-{next(self._ids)}"
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "name": name,
            "id": str(next(self._ids)),
            "operationType": kind,
            "targetLink": target,
            "status": "RUNNING" if self.polls_before_done else "DONE",
            scope: f"https://compute.googleapis.com/compute/v1/projects/{project}/"
                   f"{scope}s/{where}",
        }
        if error is not None:
            op["error"] = error
            op["httpErrorStatusCode"] = http_status
        self.operations[name] = op
        self._pending_polls[name] = self.polls_before_done
        return op

    def _bulk_insert(self, project: str, zone: str, rest: list[str],
                     query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        request_id = query.get("requestId", [""])[0]
        if request_id in self._request_ids:
            return 200, self.operations[self._request_ids[request_id]]
        count = int(body.get("count", 0))
        min_count = int(body.get("minCount", count))
        pattern = body.get("namePattern", "")
        props = body.get("instanceProperties", {})
        if not pattern or "#" not in pattern or count < 1 or min_count > count:
            return _error(400, "invalid")
        problem = shape_problem(props)
        if problem is not None:
            return _error(400, f"invalid: {problem}")
        existing = self.instances.setdefault(zone, {})
        available = self.stock.get(zone, 10**9) - len(existing)
        error = None
        target = self._reservation_target(zone, props.get("reservationAffinity") or {})
        if isinstance(target, dict):
            error = target
        elif target is not None:
            # A specific reservation's free VMs are its own stock; zone stock is not used.
            name, block = target
            size = (int(self.reservations[zone][name]["specificReservation"]["count"])
                    if block is None else self.blocks[(zone, name)][block])
            available = size - self.in_use(zone, name, block)
        if error is None and self.operation_error is not None:
            error = {"errors": [{"code": self.operation_error, "message": "injected"}]}
            self.operation_error = None
        elif error is None and available < min_count:
            error = {"errors": [{
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                "message": f"The zone '{zone}' does not have enough resources available.",
            }]}
        if error is None:
            for name in _names(pattern, min(count, available), existing):
                existing[name] = {
                    "kind": "compute#instance",
                    "id": str(next(self._ids)),
                    "name": name,
                    "zone": f"https://compute.googleapis.com/compute/v1/projects/{project}"
                            f"/zones/{zone}",
                    "machineType": f"https://compute.googleapis.com/compute/v1/projects/"
                                   f"{project}/zones/{zone}/machineTypes/"
                                   f"{props.get('machineType', '')}",
                    "status": "PROVISIONING",
                    "labels": dict(props.get("labels", {})),
                    "metadata": props.get("metadata", {"items": []}),
                    "resourcePolicies": list(props.get("resourcePolicies", [])),
                }
                if self.host_topology:
                    placement = "/".join(props.get("resourcePolicies", [])) or pattern
                    existing[name]["resourceStatus"] = {"physicalHostTopology": {
                        "block": _digest(zone), "subblock": _digest(zone, placement),
                        "host": _digest(zone, placement, name)}}
                if isinstance(target, tuple):
                    self.consumed[(zone, name)] = target
        status = 0
        if error is not None:
            status = _OPERATION_STATUS.get(error["errors"][0]["code"], 503)
        op = self._operation(project, "zone", zone, "bulkInsert", pattern, error, status)
        if request_id:
            self._request_ids[request_id] = op["name"]
        return 200, op

    def _list_instances(self, project: str, zone: str, rest: list[str],
                        query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        wanted = dict(_FILTER.findall(query.get("filter", [""])[0]))
        matches = [
            i for _, i in sorted(self.instances.get(zone, {}).items())
            if all(i["labels"].get(k) == v for k, v in wanted.items())
        ]
        start = int(query.get("pageToken", ["0"])[0] or 0)
        page = matches[start : start + self.page_size]
        reply: dict[str, Any] = {"kind": "compute#instanceList", "items": page}
        if start + self.page_size < len(matches):
            reply["nextPageToken"] = str(start + self.page_size)
        return 200, reply

    def _delete_instance(self, project: str, zone: str, rest: list[str],
                         query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        name = rest[1]
        if name not in self.instances.get(zone, {}):
            return _error(404, "notFound")
        del self.instances[zone][name]
        self.consumed.pop((zone, name), None)
        for (z, mig), members in self.mig_members.items():
            if z == zone and name in members:
                # The MIG keeps its size: a member deleted behind its back comes back.
                self._mig_vm(zone, mig, name, placement="recreated")
        return 200, self._operation(project, "zone", zone, "delete", name)

    def _get_instance(self, project: str, zone: str, rest: list[str],
                      query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        found = self.instances.get(zone, {}).get(rest[1])
        return (200, found) if found is not None else _error(404, "notFound")

    def _list_managed_instances(self, project: str, zone: str, rest: list[str],
                                query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        mig = rest[1]
        members = [
            {"instance": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/"
                         f"{zone}/instances/{vm}",
             "name": vm, "id": self.instances[zone][vm]["id"], "currentAction": "NONE",
             "instanceStatus": self.instances[zone][vm]["status"]}
            for vm in self.mig_vms(zone, mig) if vm in self.instances.get(zone, {})]
        size = int(query.get("maxResults", [str(self.page_size)])[0] or self.page_size)
        start = int(query.get("pageToken", ["0"])[0] or 0)
        reply: dict[str, Any] = {"managedInstances": members[start:start + size]}
        if start + size < len(members):
            reply["nextPageToken"] = str(start + size)
        return 200, reply

    def _delete_mig_instances(self, project: str, zone: str, rest: list[str],
                              query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        mig = rest[1]
        members = self.mig_members.setdefault((zone, mig), set())
        from google.cloud import compute_v1
        from google.protobuf.json_format import ParseError

        try:  # the body's shape, as Compute's discovery document has it
            compute_v1.InstanceGroupManagersDeleteInstancesRequest.from_json(
                json.dumps(body), ignore_unknown_fields=False)
        except ParseError as exc:
            return _error(400, f"invalid: {exc}")
        names = [str(u).rsplit("/instances/", 1)[-1] for u in body.get("instances") or []]
        if not names:
            return _error(400, "invalid")
        strangers = [n for n in names if n not in members]
        if strangers and not body.get("skipInstancesOnValidationError"):
            return _error(400, "invalid")  # not a member of the group
        for vm in names:
            if vm in members:
                members.discard(vm)
                self.instances.get(zone, {}).pop(vm, None)
        return 200, self._operation(project, "zone", zone, "deleteInstances", mig)

    def _reservation_target(
        self, zone: str, affinity: dict[str, Any]
    ) -> tuple[str, str | None] | dict[str, Any] | None:
        """(reservation, block) a SPECIFIC_RESERVATION affinity names, an operation error
        when it names none that exists here, None for other affinities."""
        if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
            return None
        values = affinity.get("values") or []
        if affinity.get("key") != "compute.googleapis.com/reservation-name" or len(values) != 1:
            return {"errors": [{"code": "INVALID_FIELD_VALUE",
                                "message": "reservationAffinity: one reservation name"}]}
        value = values[0].rsplit("/reservations/", 1)[-1]
        name, _, block = value.partition("/reservationBlocks/")
        if name not in self.reservations.get(zone, {}) or (
            block and block not in self.blocks.get((zone, name), {})
        ):
            return {"errors": [{"code": "RESOURCE_NOT_FOUND",
                                "message": f"reservation {values[0]} not found in {zone}"}]}
        return name, block or None

    def _insert_resize_request(self, project: str, zone: str, rest: list[str],
                               query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        mig, name = rest[1], body.get("name", "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
            return _error(400, "invalid")
        if ("resizeBy" in body) == ("instances" in body):
            return _error(400, "invalid")  # exactly one of resizeBy and instances
        seconds = int((body.get("requestedRunDuration") or {}).get("seconds", "0"))
        if not 600 <= seconds <= 7 * 24 * 3600:
            return _error(400, "invalid")
        if (zone, mig, name) in self.resize_requests:
            return _error(409, "alreadyExists")
        problem = resize_request_problem(body)
        if problem is not None:
            return _error(400, f"invalid: {problem}")
        found: dict[str, Any] = {
            "kind": "compute#instanceGroupManagerResizeRequest", "name": name,
            "requestedRunDuration": {"seconds": str(seconds)},
            "state": "ACCEPTED", "creationTimestamp": "2026-12-02T08:00:00.000-08:00",
            "zone": zone, "description": body.get("description", ""),
        }
        if "instances" in body:
            names = [i.get("name", "") for i in body["instances"]]
            taken = set(self.instances.get(zone, {})) | {
                i["name"] for (z, _, _), rr in self.resize_requests.items() if z == zone
                for i in rr.get("instances", [])}
            if (not names or len(set(names)) != len(names) or set(names) & taken
                    or not all(re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", n)
                               for n in names)):
                return _error(400, "invalid")
            found["instances"] = [{"name": n} for n in names]
        else:
            found["resizeBy"] = int(body["resizeBy"])
        self.resize_requests[(zone, mig, name)] = found
        self._reads[(zone, mig, name)] = 0
        return 200, self._operation(project, "zone", zone, "insert", name)

    def _list_resize_requests(self, project: str, zone: str, rest: list[str],
                              query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        mig = rest[1]
        items = [rr for (z, m, _), rr in sorted(self.resize_requests.items())
                 if z == zone and m == mig]
        return 200, {"kind": "compute#instanceGroupManagerResizeRequestsListResponse",
                     "items": items}

    def _advance(self, zone: str, mig: str, name: str) -> None:
        """A read of an ACCEPTED request, with ``grant_after_polls``: the queue's turn
        comes once the zone's stock holds the gang (CREATING for one read, then
        granted)."""
        found = self.resize_requests[(zone, mig, name)]
        if self.grant_after_polls is None or found["state"] not in ("ACCEPTED", "CREATING"):
            return
        if found["state"] == "CREATING":
            self.grant(zone, mig, name)
            return
        self._reads[(zone, mig, name)] = self._reads.get((zone, mig, name), 0) + 1
        count = len(found["instances"]) if "instances" in found else int(found["resizeBy"])
        room = self.stock.get(zone, 10**9) - len(self.instances.get(zone, {}))
        if self._reads[(zone, mig, name)] > self.grant_after_polls and room >= count:
            found["state"] = "CREATING"

    def _get_resize_request(self, project: str, zone: str, rest: list[str],
                            query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        found = self.resize_requests.get((zone, rest[1], rest[3]))
        if found is None:
            return _error(404, "notFound")
        self._advance(zone, rest[1], rest[3])
        return 200, found

    def _cancel_resize_request(self, project: str, zone: str, rest: list[str],
                               query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        found = self.resize_requests.get((zone, rest[1], rest[3]))
        if found is None:
            return _error(404, "notFound")
        if found["state"] != "ACCEPTED":
            return _error(400, "invalid")  # only a queued request can be cancelled
        found["state"] = "CANCELLED"
        return 200, self._operation(project, "zone", zone, "cancel", rest[3])

    def _delete_resize_request(self, project: str, zone: str, rest: list[str],
                               query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        found = self.resize_requests.get((zone, rest[1], rest[3]))
        if found is None:
            return _error(404, "notFound")
        if found["state"] in ("ACCEPTED", "CREATING"):
            return _error(400, "invalid")  # cancel first
        del self.resize_requests[(zone, rest[1], rest[3])]
        return 200, self._operation(project, "zone", zone, "delete", rest[3])

    def _get_reservation(self, project: str, zone: str, rest: list[str],
                         query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        name = rest[1]
        found = self.reservations.get(zone, {}).get(name)
        if found is None:
            return _error(404, "notFound")
        reply = json.loads(json.dumps(found))
        reply["specificReservation"]["inUseCount"] = str(self.in_use(zone, name))
        return 200, reply

    def _get_reservation_block(self, project: str, zone: str, rest: list[str],
                               query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        name, block = rest[1], rest[3]
        size = self.blocks.get((zone, name), {}).get(block)
        if size is None:
            return _error(404, "notFound")
        return 200, {"resource": {
            "kind": "compute#reservationBlock", "name": block, "status": "READY",
            "count": size, "inUseCount": self.in_use(zone, name, block),
        }}

    def _wait_operation(self, project: str, where: str, rest: list[str],
                        query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        name = rest[1]
        op = self.operations.get(name)
        if op is None:
            return _error(404, "notFound")
        if self._pending_polls.get(name, 0) > 0:
            self._pending_polls[name] -= 1
        else:
            op["status"] = "DONE"
        return 200, op

    _get_operation = _wait_operation

    def _insert_policy(self, project: str, region: str, rest: list[str],
                       query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        policies = self.policies.setdefault(region, {})
        if body["name"] in policies:
            return _error(409, "alreadyExists")
        policies[body["name"]] = body
        return 200, self._operation(project, "region", region, "insert", body["name"])

    def _delete_policy(self, project: str, region: str, rest: list[str],
                       query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        name = rest[1]
        if name not in self.policies.get(region, {}):
            return _error(404, "notFound")
        users = [i for i in self.all_instances()
                 if any(p.endswith(f"/{name}") for p in i["resourcePolicies"])]
        if users:
            return _error(400, "resourceInUseByAnotherResource")
        del self.policies[region][name]
        return 200, self._operation(project, "region", region, "delete", name)


_OPERATION_STATUS = {"RESOURCE_NOT_FOUND": 404, "INVALID_FIELD_VALUE": 400}
"""httpErrorStatusCode of a failed operation by its first error code (else 503)."""


def _action(method: str, path: str) -> str:
    if path.endswith("/instances/bulkInsert"):
        return "bulk_insert"
    if path.endswith("/instances") and method == "GET":
        return "list_instances"
    if "/instances/" in path and method == "DELETE":
        return "delete_instance"
    if "/instances/" in path and method == "GET":
        return "get_instance"
    if path.endswith("/listManagedInstances"):
        return "list_managed_instances"
    if path.endswith("/deleteInstances"):
        return "delete_mig_instances"
    if "/operations/" in path:
        return "wait_operation" if path.endswith("/wait") else "get_operation"
    if "/resizeRequests" in path:
        if path.endswith("/resizeRequests"):
            return "insert_resize_request" if method == "POST" else "list_resize_requests"
        if path.endswith("/cancel"):
            return "cancel_resize_request"
        return {"GET": "get_resize_request", "DELETE": "delete_resize_request"}.get(
            method, "unknown")
    if "/reservationBlocks/" in path and method == "GET":
        return "get_reservation_block"
    if "/reservations/" in path and method == "GET":
        return "get_reservation"
    if path.endswith("/resourcePolicies") and method == "POST":
        return "insert_policy"
    if "/resourcePolicies/" in path and method == "DELETE":
        return "delete_policy"
    return "unknown"


def _names(pattern: str, count: int, existing: dict[str, Any]) -> list[str]:
    """Numbering continues after the highest existing name matching the pattern."""
    match = re.search(r"#+", pattern)
    assert match is not None
    width = len(match.group())
    head, tail = pattern[: match.start()], pattern[match.end():]
    taken = re.compile(re.escape(head) + r"(\d+)" + re.escape(tail) + "$")
    highest = max((int(m.group(1)) for n in existing if (m := taken.match(n))), default=0)
    return [f"{head}{str(highest + i).zfill(width)}{tail}" for i in range(1, count + 1)]


def shape_problem(props: Any) -> str | None:
    """What Compute would refuse in a bulkInsert's ``instanceProperties`` by its shape: a
    field its API does not have (the message types of google-cloud-compute, generated from
    Compute's discovery document, parse it strictly), a ``nicType`` outside its enum, more
    network interfaces than a VM can have."""
    from google.cloud import compute_v1
    from google.protobuf.json_format import ParseError

    try:
        compute_v1.InstanceProperties.from_json(json.dumps(props), ignore_unknown_fields=False)
    except ParseError as exc:
        return f"instanceProperties: {exc}"
    nics = props.get("networkInterfaces") or []
    if len(nics) > 10:
        return f"instanceProperties.networkInterfaces: {len(nics)} interfaces, at most 10"
    nic_types: Any = compute_v1.NetworkInterface.NicType  # a proto-plus enum: iterable
    known = {e.name for e in nic_types} - {
        "UNDEFINED_NIC_TYPE", "UNSPECIFIED_NIC_TYPE"}
    for k, nic in enumerate(nics):
        if "nicType" in nic and nic["nicType"] not in known:
            return f"instanceProperties.networkInterfaces[{k}].nicType: {nic['nicType']!r}"
    return None


def resize_request_problem(body: Any) -> str | None:
    """What Compute would refuse in an InstanceGroupManagerResizeRequest by its shape: a
    field its API does not have (parsed strictly by google-cloud-compute's message type,
    generated from Compute's discovery document)."""
    from google.cloud import compute_v1
    from google.protobuf.json_format import ParseError

    try:
        compute_v1.InstanceGroupManagerResizeRequest.from_json(
            json.dumps(body), ignore_unknown_fields=False)
    except ParseError as exc:
        return f"resize request: {exc}"
    return None


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:12]


def _error(status: int, reason: str) -> tuple[int, Any]:
    message = f"fake compute: {reason}"
    return status, {"error": {"code": status, "message": message,
                              "errors": [{"reason": reason, "domain": "global",
                                          "message": message}]}}


@contextmanager
def serve(fake: FakeCompute) -> Iterator[str]:
    """Serve ``fake`` on an ephemeral loopback port; yields ``http://127.0.0.1:<port>``."""

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:  # a form (an OAuth token request): the handler reads it raw
                body = raw.decode(errors="replace")
            with fake.lock:
                status, reply = fake.handle(self.command, self.path, body)
                fake.lock.notify_all()
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _reply

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
