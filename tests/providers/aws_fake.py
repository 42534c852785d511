"""moto-backed EC2 client with the Fleet semantics moto leaves out.

moto 5 implements ``CreateFleet Type=instant``, DescribeInstances with tag filters and
TerminateInstances, but ignores ``ClientToken`` and ``MinTargetCapacity`` and lacks
placement groups and DescribeInstanceTopology. This wrapper adds exactly those, in the
way EC2 documents them, and delegates everything else to moto:

* a repeated ``ClientToken`` returns the first response and launches nothing;
* a per-zone stock: with ``MinTargetCapacity`` above the stock nothing launches and the
  response carries an ``InsufficientInstanceCapacity`` error; with ``partial=True`` the
  fleet launches what the stock allows (the Capacity Block behaviour) so the provider's
  own compensation is exercised;
* placement groups that cannot be deleted while a live instance uses them;
* ``crash_after_launch``: the call launches, then the "controller" dies before it can see
  the response (a ``BaseException`` no provider code catches);
* the fleet's ``volume`` tag specification (EC2 tags an instant fleet's volumes with it;
  moto applies only the launch template's) on the launched instances' volumes, over the
  template's own volume tags.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from typing import Any

from botocore.exceptions import ClientError


class ControllerCrash(BaseException):
    """The process dies: nothing after the cloud call runs."""


def _client_error(code: str, operation: str, status: int = 400) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code},
         "ResponseMetadata": {"HTTPStatusCode": status}},
        operation,
    )


class FleetSemanticsEc2:
    def __init__(self, moto_client: Any) -> None:
        self._ec2 = moto_client
        self.stock: dict[str, int] = {}
        self.partial = False
        self.crash_after_launch = False
        self.calls: Counter[str] = Counter()
        self.placement_groups: dict[str, dict[str, Any]] = {}
        self._tokens: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ec2, name)

    def _live_in_zone(self, zone: str) -> int:
        pages = self._ec2.get_paginator("describe_instances").paginate(Filters=[
            {"Name": "availability-zone", "Values": [zone]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ])
        return sum(len(r["Instances"]) for p in pages for r in p["Reservations"])

    def create_fleet(self, **kwargs: Any) -> dict[str, Any]:
        with self._lock:
            self.calls["create_fleet"] += 1
            token = kwargs.get("ClientToken")
            if token and token in self._tokens:
                return copy.deepcopy(self._tokens[token])
            override = kwargs["LaunchTemplateConfigs"][0]["Overrides"][0]
            zone = override["AvailabilityZone"]
            group = override.get("Placement", {}).get("GroupName")
            if group is not None and group not in self.placement_groups:
                raise _client_error("InvalidPlacementGroup.Unknown", "CreateFleet")
            wanted = kwargs["TargetCapacitySpecification"]["TotalTargetCapacity"]
            minimum = kwargs.get("OnDemandOptions", {}).get("MinTargetCapacity", 0)
            room = self.stock.get(zone, 10**6) - self._live_in_zone(zone)
            launch = min(wanted, max(room, 0))
            if launch < minimum and not self.partial:
                launch = 0
            response: dict[str, Any] = {"FleetId": "fleet-none", "Instances": [], "Errors": []}
            if launch > 0:
                request = copy.deepcopy(kwargs)
                request["TargetCapacitySpecification"]["TotalTargetCapacity"] = launch
                response = self._ec2.create_fleet(**request)
                response.setdefault("Errors", [])
                self._tag_volumes(kwargs, response)
            if launch < wanted:
                response["Errors"].append({
                    "ErrorCode": "InsufficientInstanceCapacity",
                    "ErrorMessage": f"only {launch} of {wanted} available in {zone}",
                    "Lifecycle": "on-demand",
                })
            if token:
                self._tokens[token] = copy.deepcopy(response)
            if self.crash_after_launch:
                raise ControllerCrash("controller killed after CreateFleet returned")
            return response

    def _tag_volumes(self, request: dict[str, Any], response: dict[str, Any]) -> None:
        tags = [t for spec in request.get("TagSpecifications") or []
                if spec["ResourceType"] == "volume" for t in spec["Tags"]]
        ids = [i for entry in response.get("Instances") or [] for i in entry["InstanceIds"]]
        if not tags or not ids:
            return
        reservations = self._ec2.describe_instances(InstanceIds=ids)["Reservations"]
        volumes = [m["Ebs"]["VolumeId"] for r in reservations for i in r["Instances"]
                   for m in i.get("BlockDeviceMappings") or [] if "Ebs" in m]
        if volumes:
            self._ec2.create_tags(Resources=volumes, Tags=tags)

    def create_placement_group(self, **kwargs: Any) -> dict[str, Any]:
        with self._lock:
            self.calls["create_placement_group"] += 1
            name = kwargs["GroupName"]
            if name in self.placement_groups:
                raise _client_error("InvalidPlacementGroup.Duplicate", "CreatePlacementGroup")
            self.placement_groups[name] = kwargs
            return {"PlacementGroup": {"GroupName": name, "State": "available"}}

    def delete_placement_group(self, **kwargs: Any) -> dict[str, Any]:
        with self._lock:
            self.calls["delete_placement_group"] += 1
            name = kwargs["GroupName"]
            if name not in self.placement_groups:
                raise _client_error("InvalidPlacementGroup.Unknown", "DeletePlacementGroup")
            del self.placement_groups[name]
            return {}

    def describe_instance_topology(self, **kwargs: Any) -> dict[str, Any]:
        # Two-level hashed network nodes, as EC2 reports them for p5/trn instances.
        return {"Instances": [
            {"InstanceId": i, "NetworkNodes": ["nn-spine-1", f"nn-leaf-{int(i[-1], 16) % 2}"]}
            for i in kwargs.get("InstanceIds", [])
        ]}
