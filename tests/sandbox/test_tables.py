"""kubectl's server-side printing: Table responses for lists, single objects and watches, with
CRD additionalPrinterColumns evaluated from their JSONPath."""

from __future__ import annotations

import copy
import json

import aiohttp

from sandbox import SandboxServer
from sandbox.tables import json_path
from tests.sandbox.conftest import WIDGET_CRD

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


async def test_crd_printer_columns_render_in_table_output(server: SandboxServer) -> None:
    crd = copy.deepcopy(WIDGET_CRD)
    crd["metadata"]["name"] = "dials.example.muster.dev"
    crd["spec"]["names"] = {"plural": "dials", "kind": "Dial"}
    crd["spec"]["versions"][0]["additionalPrinterColumns"] = [
        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
        {"name": "Ready", "type": "string",
         "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    server.store.register_crd(crd)
    server.store.create("dials", {"metadata": {"name": "d"}, "spec": {"size": 3}})
    server.store.patch("dials", "d", {"status": {"conditions": [
        {"type": "Ready", "status": "True"}]}}, subresource="status")
    async with aiohttp.ClientSession() as session, session.get(
        f"{server.url}/apis/example.muster.dev/v1/namespaces/default/dials",
        headers={"Accept": TABLE},
    ) as resp:
        body = json.loads(await resp.read())
    assert body["kind"] == "Table"
    assert [c["name"] for c in body["columnDefinitions"]] == ["Name", "Size", "Ready", "Age"]
    cells = body["rows"][0]["cells"]
    assert cells[:3] == ["d", 3, "True"] and cells[3].endswith("s")
    assert body["rows"][0]["object"]["metadata"]["name"] == "d"


async def test_pod_table_shows_phase_and_node(server: SandboxServer) -> None:
    server.store.create("pods", {"metadata": {"name": "p"}, "spec": {"containers": []}})
    async with aiohttp.ClientSession() as session, session.get(
        f"{server.url}/api/v1/namespaces/default/pods/p", headers={"Accept": TABLE},
    ) as resp:
        body = json.loads(await resp.read())
    assert body["rows"][0]["cells"][:3] == ["p", "Pending", "<none>"]


def test_json_path_subset() -> None:
    obj = {"a": {"b": [{"k": "x", "v": 1}, {"k": "y", "v": 2}]}}
    assert json_path(obj, ".a.b[1].v") == 2
    assert json_path(obj, '.a.b[?(@.k=="x")].v') == 1
    assert json_path(obj, "{.a.b[0].k}") == "x"
    assert json_path(obj, ".a.missing") is None
    assert json_path(obj, "..recursive") is None
