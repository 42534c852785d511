"""EC2 over real HTTP on 127.0.0.1: moto's server, and one small layer in front of it.

:class:`MotoServer` runs ``python -m moto.server`` on a free loopback port. :class:`Ec2Layer`
is an HTTP proxy in front of it (the endpoint Muster's AWS provider is given through
``MUSTER_AWS_ENDPOINT_URL``) that forwards every request unchanged except the few moto gets
wrong or lacks, which Muster relies on; each is answered the way EC2 documents it:

* ``CreateFleet Type=instant``: moto ignores ``ClientToken`` and ``OnDemandOptions.
  MinTargetCapacity``. Here a repeated token returns the first response and launches
  nothing; a per-zone stock (:attr:`Ec2Layer.stock`, live instances a zone may hold) below
  ``MinTargetCapacity`` launches nothing and answers ``InsufficientInstanceCapacity`` in the
  response's ``Errors`` (HTTP 200, as EC2 does). :meth:`Ec2Layer.inject_partial_fleet` makes
  the next fleet launch only some instances and report ``InsufficientInstanceCapacity`` for
  the rest (capacity lost while the fleet launched), so the provider's rollback runs.
* ``CreateFleet``'s ``volume`` tag specification: EC2 tags an instant fleet's volumes with
  it; moto applies only the launch template's. Here the launched instances' volumes get it
  (over the template's own volume tags), so a platform team's cost audit by tag sees on the
  tier what it sees on EC2.
* ``DescribeInstanceTopology``: moto answers HTTP 500. Here each instance gets three network
  node layers derived from its zone and placement (its fleet's placement group, else the
  fleet): instances launched together share them, deterministically per placement, as EC2
  reports them for p5/trn instances.
* ``CreatePlacementGroup`` / ``DeletePlacementGroup`` / ``DescribePlacementGroups``: moto's
  server answers HTTP 500; here they are kept by the layer (a group in use cannot be deleted).
* Capacity reservations (moto has none): :meth:`Ec2Layer.add_capacity_reservation` makes an
  On-Demand Capacity Reservation or a Capacity Block (its ``start``/``end``; its state is
  ``scheduled`` before the start, ``active`` inside, ``expired`` after), optionally in
  resource groups. ``DescribeCapacityReservations`` (by id, or with the ``instance-type``,
  ``availability-zone`` and ``state`` filters) answers ``AvailableInstanceCount`` = total -
  its live instances; ``GetGroupsForCapacityReservation`` the groups; an unknown id
  ``InvalidCapacityReservationId.NotFound``. A ``CreateFleet`` whose launch template targets
  a reservation (``CapacityReservationSpecification.CapacityReservationTarget``, by id or
  resource group, as Muster's copy of the template does) launches only into the
  reservation's free instances in the fleet's zone, not the zone's stock: all or nothing
  with ``OnDemandOptions.MinTargetCapacity``, else (a ``capacity-block`` fleet) as many as
  are free, the shortfall reported as ``ReservationCapacityExceeded``; nothing outside a
  block's window. moto launches them as on-demand instances (it launches nothing for
  ``capacity-block``), and the layer remembers which reservation each one is in.
  ``DescribeCapacityReservations`` also takes ``tag:<key>`` filters, and answers each
  reservation's ``tagSet`` and ``createDate``.
* Capacity Block offerings and purchase (moto has neither): :meth:`Ec2Layer.offer_capacity_block`
  puts a block of ``count`` instances of a type in a zone on sale, at an upfront fee,
  starting now or later. ``DescribeCapacityBlockOfferings`` (``InstanceType``,
  ``InstanceCount``, the required ``CapacityDurationHours``) answers an offering per block on
  sale of exactly that type and count, lasting the asked hours from its start; hours EC2
  does not offer (not 24-hour days up to 14 days, then whole weeks up to 182 days) answer
  ``InvalidParameterValue``. ``PurchaseCapacityBlock`` (``CapacityBlockOfferingId``,
  ``InstancePlatform``, ``TagSpecifications`` of ``capacity-reservation``) takes the block
  off sale and creates its Capacity Block reservation (``reservationType``
  ``capacity-block``, the offering's window, the tags), answered as ``capacityReservation``
  and ``capacityBlockSet``; it is then a reservation as above, so a ``capacity-block``
  fleet targeting it launches into it. An offering id not (or no longer) on sale answers
  ``InvalidCapacityBlockOfferingId.NotFound``.

Anything else (DescribeInstances, TerminateInstances, launch templates, tags, user data) is
moto's own. Not simulated for reservations: instance platform, tenancy and match criteria,
an open (untargeted) reservation absorbing matching on-demand launches, reservation fleets,
a block's instances being stopped at its end, and which error code EC2 really answers for a
launch before a block's start. Not simulated for Capacity Blocks: the ``payment-pending``
state after a purchase (a bought block is at once ``scheduled`` or ``active``), EC2's start
times (it offers blocks starting at 11:30 UTC; here at the time the test gives), prices
varying with the duration (an offer's fee is the same for every length), the date-range,
paging and UltraServer inputs, cancelling (EC2 has no call for it; neither has the layer),
and the exact error codes EC2 answers for a bad duration or an offering no longer on sale.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode
from xml.sax.saxutils import escape

XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"
_REGION = re.compile(r"Credential=[^/]+/\d+/([a-z0-9-]+)/ec2/")
_INSTANCE_ID = re.compile(r"<item>(i-[0-9a-f]+)</item>")
_TAG_SPEC = re.compile(r"TagSpecification\.(\d+)\.ResourceType")
LIVE_STATES = ("pending", "running")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """``python -m moto.server`` on 127.0.0.1, as its own process."""

    def __init__(self, log: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, within: float = 30.0) -> None:
        out = open(self._log, "ab") if self._log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1).close()
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"moto server not answering on {self.url} after {within:.0f}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Ec2Layer:
    """The fleet semantics moto lacks, in front of moto's server (see the module docstring)."""

    upstream: str
    stock: dict[str, int] = field(default_factory=dict)
    """zone -> how many live instances the zone may hold; absent = unlimited."""
    partial_fleets: list[int] = field(default_factory=list)
    """Injected: each entry is how many instances the next CreateFleet launches before it
    runs out of capacity."""
    placement_groups: dict[str, str] = field(default_factory=dict)
    """group name -> strategy."""
    fleets: dict[str, dict[str, Any]] = field(default_factory=dict)
    """instance id -> {fleet, group, zone} of the fleet that launched it."""
    actions: list[str] = field(default_factory=list)
    """Every action seen, in order (tests read it)."""
    capacity_reservations: dict[str, dict[str, Any]] = field(default_factory=dict)
    """reservation id -> {zone, instance_type, total, kind, start, end, groups, tags,
    created}."""
    reserved_in: dict[str, str] = field(default_factory=dict)
    """instance id -> the reservation it was launched into."""
    block_offers: list[dict[str, Any]] = field(default_factory=list)
    """Capacity Blocks on sale: {zone, instance_type, count, fee, start}."""
    offerings: dict[str, dict[str, Any]] = field(default_factory=dict)
    """offering id -> {offer (the block on sale), start, end} as it was offered."""
    _tokens: dict[str, bytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_capacity_reservation(
        self, rid: str, *, zone: str, instance_type: str, count: int,
        kind: str = "default", start: datetime | None = None, end: datetime | None = None,
        groups: tuple[str, ...] = (),
    ) -> None:
        """An ODCR (``kind`` default) or a Capacity Block (``capacity-block``, with its
        window) of ``count`` instances, member of the resource groups ``groups`` (ARNs)."""
        with self.lock:
            self.capacity_reservations[rid] = {
                "zone": zone, "instance_type": instance_type, "total": count, "kind": kind,
                "start": start, "end": end, "groups": tuple(groups), "tags": {},
                "created": datetime.now(UTC),
            }

    def offer_capacity_block(
        self, *, zone: str, instance_type: str, count: int, upfront_fee: str,
        start: datetime | None = None,
    ) -> None:
        """Put a Capacity Block of ``count`` instances on sale, starting at ``start`` (now
        when None), for ``upfront_fee`` (USD) whatever its length; bought once."""
        with self.lock:
            self.block_offers.append({
                "zone": zone, "instance_type": instance_type, "count": count,
                "fee": upfront_fee, "start": start})

    def inject_partial_fleet(self, launched: int) -> None:
        with self.lock:
            self.partial_fleets.append(launched)

    # ---- moto, directly ---------------------------------------------------------------

    def moto(self, region: str) -> Any:
        import boto3

        return boto3.client(
            "ec2",
            region_name=region,
            endpoint_url=self.upstream,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def _live_in_zone(self, region: str, zone: str) -> int:
        pages = (
            self.moto(region)
            .get_paginator("describe_instances")
            .paginate(
                Filters=[
                    {"Name": "availability-zone", "Values": [zone]},
                    {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
                ]
            )
        )
        return sum(len(r["Instances"]) for p in pages for r in p["Reservations"])

    # ---- requests ---------------------------------------------------------------------

    def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        form = {k: v[0] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}
        action = form.get("Action", "")
        match = _REGION.search(headers.get("Authorization", ""))
        region = match.group(1) if match else "us-east-1"
        with self.lock:
            self.actions.append(action)
            if action == "CreateFleet":
                return self._create_fleet(method, path, headers, form, region)
            if action == "DescribeInstanceTopology":
                return _xml("DescribeInstanceTopologyResponse", self._topology(form, region))
            if action == "CreatePlacementGroup":
                return self._create_group(form)
            if action == "DeletePlacementGroup":
                return self._delete_group(form, region)
            if action == "DescribePlacementGroups":
                return _xml("DescribePlacementGroupsResponse", self._describe_groups(form))
            if action == "DescribeCapacityReservations":
                return self._describe_reservations(form, region)
            if action == "GetGroupsForCapacityReservation":
                return self._reservation_groups(form)
            if action == "DescribeCapacityBlockOfferings":
                return self._block_offerings(form)
            if action == "PurchaseCapacityBlock":
                return self._purchase_block(form, region)
        return self.forward(method, path, headers, body)

    def forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        keep = {
            k: v
            for k, v in headers.items()
            if k.lower() not in ("host", "content-length", "connection")
        }
        request = urllib.request.Request(
            self.upstream + path, data=body or None, headers=keep, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return (
                    response.status,
                    {"Content-Type": response.headers.get("Content-Type", "text/xml")},
                    response.read(),
                )
        except urllib.error.HTTPError as exc:
            return (
                exc.code,
                {"Content-Type": exc.headers.get("Content-Type", "text/xml")},
                exc.read(),
            )

    def _create_fleet(
        self, method: str, path: str, headers: dict[str, str], form: dict[str, str], region: str
    ) -> tuple[int, dict[str, str], bytes]:
        token = form.get("ClientToken")
        if token and token in self._tokens:
            return 200, {"Content-Type": "text/xml"}, self._tokens[token]
        wanted = int(form.get("TargetCapacitySpecification.TotalTargetCapacity", "0"))
        minimum = int(form.get("OnDemandOptions.MinTargetCapacity", "0"))
        # Several overrides (one per subnet) with SingleAvailabilityZone: EC2 keeps to one
        # zone, the first here that has the stock; moto is sent only that override.
        form, prefix = self._one_zone(form, region, max(minimum, 1))
        zone = form.get(prefix + "AvailabilityZone", "")
        group = form.get(prefix + "Placement.GroupName")
        if group is not None and group not in self.placement_groups:
            return _error(
                400, "InvalidPlacementGroup.Unknown", f"The Placement Group '{group}' is unknown."
            )
        launch = wanted
        target = self._reservation_target(form, region)
        free: list[tuple[str, int]] = []
        if target is not None:
            # Only the targeted reservations' free instances, not the zone's stock.
            instance_type = form.get(prefix + "InstanceType", "")
            free = self._free_in(target, zone, instance_type, region)
            launch = min(wanted, sum(n for _, n in free))
            if launch < minimum:
                launch = 0
            # moto launches nothing for capacity-block: the instances are on-demand there.
            form = dict(form, **{"TargetCapacitySpecification.DefaultTargetCapacityType":
                                 "on-demand"})
        elif zone in self.stock:
            launch = min(wanted, max(self.stock[zone] - self._live_in_zone(region, zone), 0))
            if launch < minimum:
                launch = 0
        if self.partial_fleets:
            launch = min(launch, self.partial_fleets.pop(0))
        fleet_id = f"fleet-{uuid.uuid4()}"
        instances = b""
        if launch > 0:
            form = dict(form, **{"TargetCapacitySpecification.TotalTargetCapacity": str(launch)})
            if form.get("OnDemandOptions.MinTargetCapacity"):
                form["OnDemandOptions.MinTargetCapacity"] = str(launch)
            status, _, reply = self.forward(method, path, headers, urlencode(form).encode())
            if status != 200:
                return status, {"Content-Type": "text/xml"}, reply
            found = re.search(rb"<fleetId>([^<]*)</fleetId>", reply)
            fleet_id = found.group(1).decode() if found else fleet_id
            inner = re.search(rb"<fleetInstanceSet>(.*)</fleetInstanceSet>", reply, re.S)
            instances = inner.group(1) if inner else b""
            slots = [rid for rid, n in free for _ in range(n)]
            self._tag_volumes(form, region, _INSTANCE_ID.findall(instances.decode()))
            for k, instance_id in enumerate(_INSTANCE_ID.findall(instances.decode())):
                self.fleets[instance_id] = {"fleet": fleet_id, "group": group, "zone": zone}
                if target is not None and k < len(slots):
                    self.reserved_in[instance_id] = slots[k]
        errors = ""
        if launch < wanted:
            instance_type = form.get(prefix + "InstanceType", "")
            code, text = "InsufficientInstanceCapacity", (
                f"We currently do not have sufficient {instance_type} capacity in "
                f"the Availability Zone you requested ({zone}): {launch} of {wanted} launched."
            )
            if target is not None:
                code, text = "ReservationCapacityExceeded", (
                    f"The targeted capacity reservation ({', '.join(target) or 'none'}) has "
                    f"{sum(n for _, n in free)} instances available in {zone}: {launch} of "
                    f"{wanted} launched."
                )
            errors = (
                f"<item><errorCode>{code}</errorCode><errorMessage>{escape(text)}"
                "</errorMessage><lifecycle>on-demand</lifecycle></item>"
            )
        body = (
            (
                f'<?xml version="1.0" encoding="UTF-8"?><CreateFleetResponse xmlns="{XMLNS}">'
                f"<requestId>{uuid.uuid4()}</requestId><fleetId>{fleet_id}</fleetId>"
                f"<errorSet>{errors}</errorSet><fleetInstanceSet>"
            ).encode()
            + instances
            + b"</fleetInstanceSet></CreateFleetResponse>"
        )
        if token:
            self._tokens[token] = body
        return 200, {"Content-Type": "text/xml"}, body

    def _tag_volumes(self, form: dict[str, str], region: str, ids: list[str]) -> None:
        tags: list[dict[str, str]] = []
        for key, value in form.items():
            spec = _TAG_SPEC.fullmatch(key)
            if spec is None or value != "volume":
                continue
            for m in range(1, 51):  # at most 50 tags a resource
                tag = f"TagSpecification.{spec.group(1)}.Tag.{m}."
                if tag + "Key" not in form:
                    break
                tags.append({"Key": form[tag + "Key"], "Value": form.get(tag + "Value", "")})
        if not tags or not ids:
            return
        ec2 = self.moto(region)
        reservations = ec2.describe_instances(InstanceIds=ids)["Reservations"]
        volumes = [m["Ebs"]["VolumeId"] for r in reservations for i in r["Instances"]
                   for m in i.get("BlockDeviceMappings") or [] if "Ebs" in m]
        if volumes:
            ec2.create_tags(Resources=volumes, Tags=tags)

    # ---- capacity reservations ------------------------------------------------------

    def _reservation_target(self, form: dict[str, str], region: str) -> list[str] | None:
        """The reservations the fleet's launch template targets (None: it targets none)."""
        spec = "LaunchTemplateConfigs.1.LaunchTemplateSpecification."
        ref: dict[str, Any] = {"Versions": [form.get(spec + "Version", "$Default")]}
        if form.get(spec + "LaunchTemplateId"):
            ref["LaunchTemplateId"] = form[spec + "LaunchTemplateId"]
        else:
            ref["LaunchTemplateName"] = form.get(spec + "LaunchTemplateName", "")
        try:
            versions = self.moto(region).describe_launch_template_versions(**ref)
        except Exception:  # an unknown template: moto's own CreateFleet answers it
            return None
        data = (versions.get("LaunchTemplateVersions") or [{}])[0].get("LaunchTemplateData")
        crs = (data or {}).get("CapacityReservationSpecification") or {}
        target = crs.get("CapacityReservationTarget")
        if not target:
            return None
        if target.get("CapacityReservationId"):
            return [target["CapacityReservationId"]]
        arn = target.get("CapacityReservationResourceGroupArn")
        return [rid for rid, r in self.capacity_reservations.items() if arn in r["groups"]]

    def _state(self, r: dict[str, Any]) -> str:
        now = datetime.now(UTC)
        if r["start"] is not None and now < r["start"]:
            return "scheduled"
        if r["end"] is not None and now >= r["end"]:
            return "expired"
        return "active"

    def _used(self, rid: str, region: str) -> int:
        ids = [i for i, r in self.reserved_in.items() if r == rid]
        if not ids:
            return 0
        found = self.moto(region).describe_instances(InstanceIds=ids)["Reservations"]
        return sum(1 for r in found for i in r["Instances"] if i["State"]["Name"] in LIVE_STATES)

    def _free_in(self, target: list[str], zone: str, instance_type: str,
                 region: str) -> list[tuple[str, int]]:
        """(reservation, free instances) of the targeted reservations that can serve a
        launch of ``instance_type`` in ``zone`` now."""
        out = []
        for rid in target:
            r = self.capacity_reservations.get(rid)
            if (r is None or r["zone"] != zone or r["instance_type"] != instance_type
                    or self._state(r) != "active"):
                continue
            out.append((rid, max(0, r["total"] - self._used(rid, region))))
        return out

    def _describe_reservations(
        self, form: dict[str, str], region: str
    ) -> tuple[int, dict[str, str], bytes]:
        ids = [v for k, v in sorted(form.items()) if k.startswith("CapacityReservationId.")]
        unknown = [i for i in ids if i not in self.capacity_reservations]
        if unknown:
            return _error(400, "InvalidCapacityReservationId.NotFound",
                          f"The capacity reservation ID '{unknown[0]}' does not exist")
        filters: dict[str, set[str]] = {}
        for key, name in form.items():
            if key.startswith("Filter.") and key.endswith(".Name"):
                n = key.split(".")[1]
                filters[name] = {v for k, v in form.items()
                                 if k.startswith(f"Filter.{n}.Value.")}
        items = []
        for rid, r in sorted(self.capacity_reservations.items()):
            state = self._state(r)
            fields = {"instance-type": r["instance_type"], "availability-zone": r["zone"],
                      "state": state}
            fields.update({f"tag:{k}": v for k, v in r.get("tags", {}).items()})
            if (ids and rid not in ids) or any(
                    fields.get(name, "") not in values for name, values in filters.items()):
                continue
            items.append(self._reservation_xml(rid, r, region, tag="item"))
        return _xml("DescribeCapacityReservationsResponse",
                    f"<capacityReservationSet>{''.join(items)}</capacityReservationSet>")

    def _reservation_xml(self, rid: str, r: dict[str, Any], region: str, *, tag: str) -> str:
        state = self._state(r)
        available = max(0, r["total"] - self._used(rid, region)) if state == "active" else 0
        dates = "".join(
            f"<{name}>{_when(when)}</{name}>"
            for name, when in (("startDate", r["start"]), ("endDate", r["end"]),
                               ("createDate", r.get("created")))
            if when is not None)
        tags = "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>"
                       for k, v in sorted(r.get("tags", {}).items()))
        return (
            f"<{tag}><capacityReservationId>{rid}</capacityReservationId><instanceType>"
            f"{r['instance_type']}</instanceType><instancePlatform>Linux/UNIX"
            f"</instancePlatform><availabilityZone>{r['zone']}"
            f"</availabilityZone><totalInstanceCount>{r['total']}</totalInstanceCount>"
            f"<availableInstanceCount>{available}</availableInstanceCount><state>{state}"
            f"</state><reservationType>{r['kind']}</reservationType>{dates}"
            f"<instanceMatchCriteria>targeted</instanceMatchCriteria><tagSet>{tags}</tagSet>"
            f"</{tag}>")

    # ---- Capacity Block offerings and purchase ------------------------------------------

    def _block_offerings(self, form: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        try:
            hours = int(form.get("CapacityDurationHours", ""))
        except ValueError:
            return _error(400, "MissingParameter",
                          "The request must contain the parameter CapacityDurationHours")
        days, part = divmod(hours, 24)
        if part or not (1 <= days <= 14 or (days % 7 == 0 and 14 < days <= 182)):
            return _error(400, "InvalidParameterValue",
                          f"Capacity Blocks are not offered for {hours} hours")
        instance_type = form.get("InstanceType", "")
        count = int(form.get("InstanceCount") or 0)
        now = datetime.now(UTC)
        items = []
        for n, offer in enumerate(self.block_offers):
            if offer["instance_type"] != instance_type or (count and offer["count"] != count):
                continue
            start = offer["start"] or now
            end = start + timedelta(hours=hours)
            oid = "cb-" + hashlib.sha256(
                f"{n}/{offer['zone']}/{start.isoformat()}/{hours}".encode()).hexdigest()[:17]
            self.offerings[oid] = {"offer": offer, "start": start, "end": end}
            items.append(
                f"<item><capacityBlockOfferingId>{oid}</capacityBlockOfferingId>"
                f"<instanceType>{instance_type}</instanceType><availabilityZone>"
                f"{offer['zone']}</availabilityZone><instanceCount>{offer['count']}"
                f"</instanceCount><startDate>{_when(start)}</startDate><endDate>{_when(end)}"
                f"</endDate><capacityBlockDurationHours>{hours}</capacityBlockDurationHours>"
                f"<upfrontFee>{escape(offer['fee'])}</upfrontFee><currencyCode>USD"
                f"</currencyCode><tenancy>default</tenancy></item>")
        return _xml("DescribeCapacityBlockOfferingsResponse",
                    f"<capacityBlockOfferingSet>{''.join(items)}</capacityBlockOfferingSet>")

    def _purchase_block(self, form: dict[str, str],
                        region: str) -> tuple[int, dict[str, str], bytes]:
        oid = form.get("CapacityBlockOfferingId", "")
        if not form.get("InstancePlatform"):
            return _error(400, "MissingParameter",
                          "The request must contain the parameter InstancePlatform")
        offering = self.offerings.get(oid)
        on_sale = [k for k, o in enumerate(self.block_offers)
                   if offering is not None and o is offering["offer"]]
        if offering is None or not on_sale:
            return _error(400, "InvalidCapacityBlockOfferingId.NotFound",
                          f"The Capacity Block offering ID '{oid}' does not exist")
        offer = self.block_offers.pop(on_sale[0])  # bought once: the block is off sale
        tags: dict[str, str] = {}
        for key, value in form.items():
            spec = _TAG_SPEC.fullmatch(key)
            if spec is None or value != "capacity-reservation":
                continue
            for m in range(1, 51):
                tag = f"TagSpecification.{spec.group(1)}.Tag.{m}."
                if tag + "Key" not in form:
                    break
                tags[form[tag + "Key"]] = form.get(tag + "Value", "")
        rid = "cr-" + uuid.uuid4().hex[:17]
        block = {
            "zone": offer["zone"], "instance_type": offer["instance_type"],
            "total": offer["count"], "kind": "capacity-block", "start": offering["start"],
            "end": offering["end"], "groups": (), "tags": tags, "created": datetime.now(UTC),
        }
        self.capacity_reservations[rid] = block
        blocks = (
            f"<item><capacityBlockId>cbr-{rid[3:]}</capacityBlockId><availabilityZone>"
            f"{block['zone']}</availabilityZone><capacityReservationIdSet><item>{rid}</item>"
            f"</capacityReservationIdSet><startDate>{_when(block['start'])}</startDate>"
            f"<endDate>{_when(block['end'])}</endDate><createDate>{_when(block['created'])}"
            f"</createDate><state>{self._state(block)}</state></item>")
        return _xml("PurchaseCapacityBlockResponse",
                    self._reservation_xml(rid, block, region, tag="capacityReservation")
                    + f"<capacityBlockSet>{blocks}</capacityBlockSet>")

    def _reservation_groups(self, form: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        rid = form.get("CapacityReservationId", "")
        found = self.capacity_reservations.get(rid)
        if found is None:
            return _error(400, "InvalidCapacityReservationId.NotFound",
                          f"The capacity reservation ID '{rid}' does not exist")
        items = "".join(f"<item><groupArn>{escape(arn)}</groupArn><ownerId>123456789012"
                        f"</ownerId></item>" for arn in found["groups"])
        return _xml("GetGroupsForCapacityReservationResponse",
                    f"<capacityReservationGroupSet>{items}</capacityReservationGroupSet>")
    def _one_zone(
        self, form: dict[str, str], region: str, minimum: int
    ) -> tuple[dict[str, str], str]:
        """``form`` with its first launch template config's overrides cut to the one EC2
        would use: the first whose zone has ``minimum`` instances of stock (else the
        first); and the form prefix of that override."""
        config = "LaunchTemplateConfigs.1.Overrides."
        count = 1
        while f"{config}{count + 1}.AvailabilityZone" in form:
            count += 1
        chosen = 1
        for k in range(1, count + 1):
            zone = form.get(f"{config}{k}.AvailabilityZone", "")
            if zone not in self.stock or self.stock[zone] - self._live_in_zone(
                region, zone
            ) >= minimum:
                chosen = k
                break
        kept = {key: value for key, value in form.items() if not key.startswith(config)}
        for key, value in form.items():
            if key.startswith(f"{config}{chosen}."):
                kept[f"{config}1." + key[len(f"{config}{chosen}."):]] = value
        return kept, f"{config}1."

    def network_nodes(self, instance_id: str, zone: str) -> list[str]:
        """Three layers, as EC2 reports them: a spine per zone, and below it the nodes of
        the instance's placement (its fleet's placement group, else its fleet)."""
        where = self.fleets.get(instance_id, {})
        placement = where.get("group") or where.get("fleet") or instance_id

        def node(*parts: str) -> str:
            return "nn-" + hashlib.sha256("/".join(parts).encode()).hexdigest()[:17]

        return [node(zone), node(zone, placement, "2"), node(zone, placement, "3")]

    def _topology(self, form: dict[str, str], region: str) -> str:
        ids = [v for k, v in sorted(form.items()) if k.startswith("InstanceId.")]
        kwargs: dict[str, Any] = {"InstanceIds": ids} if ids else {}
        try:
            reservations = self.moto(region).describe_instances(**kwargs)["Reservations"]
        except Exception:  # an unknown id: EC2 answers with the ones it knows
            reservations = []
        items = []
        for reservation in reservations:
            for i in reservation["Instances"]:
                if i["State"]["Name"] not in LIVE_STATES:
                    continue
                zone = i["Placement"]["AvailabilityZone"]
                nodes = "".join(
                    f"<item>{n}</item>" for n in self.network_nodes(i["InstanceId"], zone)
                )
                group = self.fleets.get(i["InstanceId"], {}).get("group") or ""
                items.append(
                    f"<item><instanceId>{i['InstanceId']}</instanceId><instanceType>"
                    f"{i['InstanceType']}</instanceType><groupName>{escape(group)}</groupName>"
                    f"<networkNodeSet>{nodes}</networkNodeSet><availabilityZone>{zone}"
                    f"</availabilityZone><zoneId>{zone}</zoneId></item>"
                )
        return f"<instanceSet>{''.join(items)}</instanceSet>"

    def _create_group(self, form: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        name = form.get("GroupName", "")
        if name in self.placement_groups:
            return _error(
                400,
                "InvalidPlacementGroup.Duplicate",
                f"The placement group '{name}' already exists.",
            )
        self.placement_groups[name] = form.get("Strategy", "cluster")
        return _xml(
            "CreatePlacementGroupResponse",
            _group_xml(name, self.placement_groups[name], tag="placementGroup"),
        )

    def _delete_group(self, form: dict[str, str], region: str) -> tuple[int, dict[str, str], bytes]:
        name = form.get("GroupName", "")
        if name not in self.placement_groups:
            return _error(
                400, "InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown."
            )
        users = [i for i, where in self.fleets.items() if where.get("group") == name]
        if users:
            pages = self.moto(region).describe_instances(InstanceIds=users)["Reservations"]
            if any(i["State"]["Name"] in LIVE_STATES for r in pages for i in r["Instances"]):
                return _error(
                    400, "InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use."
                )
        del self.placement_groups[name]
        return _xml("DeletePlacementGroupResponse", "<return>true</return>")

    def _describe_groups(self, form: dict[str, str]) -> str:
        names = [v for k, v in form.items() if k.startswith("GroupName.")]
        items = "".join(
            _group_xml(n, s, tag="item")
            for n, s in self.placement_groups.items()
            if not names or n in names
        )
        return f"<placementGroupSet>{items}</placementGroupSet>"


def _group_xml(name: str, strategy: str, *, tag: str) -> str:
    return (
        f"<{tag}><groupName>{escape(name)}</groupName><strategy>{escape(strategy)}"
        f"</strategy><state>available</state></{tag}>"
    )


def _when(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _xml(root: str, inner: str) -> tuple[int, dict[str, str], bytes]:
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?><{root} xmlns="{XMLNS}"><requestId>'
        f"{uuid.uuid4()}</requestId>{inner}</{root}>"
    )
    return 200, {"Content-Type": "text/xml"}, body.encode()


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}'
        f"</Code><Message>{escape(message)}</Message></Error></Errors><RequestID>"
        f"{uuid.uuid4()}</RequestID></Response>"
    )
    return status, {"Content-Type": "text/xml"}, body.encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-request (a Muster process killed by a scenario) is
        # part of the test, not a server error worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve(layer: Ec2Layer) -> Iterator[str]:
    """Serve ``layer`` on an ephemeral loopback port; yields its endpoint URL."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            status, headers, data = layer.handle(self.command, self.path, dict(self.headers), raw)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PUT = _reply

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def ec2_endpoint(log: str | None = None) -> Iterator[tuple[str, Ec2Layer]]:
    """moto's server and the layer in front of it; yields (endpoint URL, layer)."""
    moto = MotoServer(log)
    moto.start()
    try:
        layer = Ec2Layer(moto.url)
        with serve(layer) as url:
            yield url, layer
    finally:
        moto.stop()


AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
"""Credentials moto accepts (any); a process talking to the endpoint needs some."""


def aws_env(endpoint: str) -> dict[str, str]:
    """Environment of a Muster process using the AWS provider against ``endpoint``."""
    return dict(AWS_TEST_ENV, MUSTER_AWS_ENDPOINT_URL=endpoint)
