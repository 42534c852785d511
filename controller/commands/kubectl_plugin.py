"""``kubectl muster``: what Muster could provision, why a gang waits, what-if a gang came.

Installed as the executable ``kubectl-muster`` (pyproject ``[project.scripts]``), which is how
kubectl and krew find plugins. Read-only: it lists and gets, never writes.

* ``capacity``: the per-domain table of every CapacityPool, from the status the controller
  writes (:mod:`controller.state.pool_figures`).
* ``explain REQUEST [-n NS]``: a request's plan (booked: where, which nodes) or its
  shortfall (the controller's condition), and what planning it again now would say.
* ``fit -f FILE``: would this ProvisioningRequest (with its PodTemplates) or batch/v1 Job
  fit now, where, and what would be bought. The cluster is read into the controller's own
  cache (:class:`controller.state.feeds.Feeds`, one list per kind), stock-outs the
  controller reported on its pools are applied, the gang is built by the reconciler's
  :func:`controller.reconcilers.provisioning.gang.build_gang`, and planned by the planner's
  :class:`controller.fit.PlanningPass`: the controller, given the same cluster, plans the same.

Tables by default, ``-o json`` or ``-o yaml`` for machines. Exit codes: 0 (``fit``: it fits),
1 (``fit``: it does not), 2 for any error, in one line.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from controller.config import MusterConfig
    from controller.fit.types import NoFit, Plan
    from controller.kube import KubeClient
    from controller.state.cache import ClusterState
    from controller.state.requests import RequestRecord

EXIT_FIT, EXIT_NO_FIT, EXIT_ERROR = 0, 1, 2
JOB_CLASS_ANNOTATION = "muster.dev/provisioning-class"
"""On a Job given to ``fit``: the class to plan it as (default: atomic provisioning)."""

app = typer.Typer(
    name="kubectl-muster",
    help="What Muster could provision, why a gang waits, and what-if a gang came. Read-only.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class Output(enum.StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


class PluginError(Exception):
    """Something the user must fix; printed as one line, exit 2."""


KubeconfigOpt = Annotated[
    Path | None,
    typer.Option("--kubeconfig", help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config)."),
]
ContextOpt = Annotated[str | None, typer.Option("--context", help="Kubeconfig context.")]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table, json or yaml.")]
NamespaceOpt = Annotated[str, typer.Option("--namespace", "-n", help="Namespace.")]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Muster's config file (topology levels, classes); "
                 "default: Muster's defaults."),
]


def main() -> None:  # pragma: no cover - the console script
    app()


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_ERROR)


def _check_kubeconfig(kubeconfig: Path | None) -> None:
    if kubeconfig is not None and not kubeconfig.is_file():
        _fail(f"kubeconfig {kubeconfig} not found")


def _run(work: Any) -> Any:
    """Run a coroutine; a problem the user must fix becomes one line and exit 2."""
    from controller.kube import ApiError

    try:
        return asyncio.run(work)
    except PluginError as exc:
        _fail(str(exc))
    except ApiError as exc:
        what = exc.reason if exc.status else f"cannot reach the API server ({exc.reason})"
        _fail(f"the API server answered {exc.status} {what}" if exc.status else what)
    except (OSError, ValueError) as exc:
        _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _run_sync(work: Any) -> Any:
    try:
        return work()
    except PluginError as exc:
        _fail(str(exc))


async def _connect(kubeconfig: Path | None, context: str | None) -> KubeClient:
    from controller.kube import KubeClient

    try:
        return await KubeClient.from_kubeconfig(kubeconfig, context=context)
    except Exception as exc:  # the kubeconfig loader raises its own types
        raise PluginError(f"cannot load the kubeconfig: {str(exc).splitlines()[0]}") from None


def _config(path: Path | None) -> MusterConfig:
    from controller.config import ConfigError, MusterConfig, load_config

    if path is None:
        return MusterConfig()
    try:
        return load_config(path)
    except ConfigError as exc:
        raise PluginError(" ".join(str(exc).split())) from None


async def live_state(kube: KubeClient, config: MusterConfig) -> ClusterState:
    """The cluster as the controller's cache holds it (nodes, pods, templates, pools,
    requests with their bookings, DRA objects), plus what the controller reported on its
    pools' status (stock-outs; pools it found invalid): what its planner would plan against
    now."""
    from controller.state.cache import ClusterState
    from controller.state.feeds import Feeds

    state = ClusterState(levels=config.topology.levels)
    await Feeds(kube, state).list_once()
    now = datetime.now(UTC)
    for name in state.pool_registry.pools():
        valid = _condition(state.pool_registry.pool_status(name).get("conditions") or [], "Valid")
        if valid.get("status") == "False":  # the controller does not plan on it either
            state.set_pool_unusable(name, (str(valid.get("message") or "invalid"),))
        for domain in state.pool_registry.pool_status(name).get("domains") or []:
            until = _time(domain.get("stockOutUntil"))
            if until is not None and until > now:
                state.mark_short(name, domain.get("labels") or {},
                                 available=int(domain.get("stockOutNodes") or 0), until=until)
    return state


def _time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


# ---------------------------------------------------------------------------- output


def _emit(payload: Any, output: Output, table: Any) -> None:
    if output is Output.JSON:
        typer.echo(json.dumps(payload, indent=2, sort_keys=True))
    elif output is Output.YAML:
        import yaml

        typer.echo(yaml.safe_dump(payload, sort_keys=True), nl=False)
    else:
        table()


def table_text(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A kubectl-style table: upper-case headers, columns padded with three spaces."""
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def _short(resources: Mapping[str, Any]) -> str:
    """The resources that decide placement (accelerators first), compactly."""
    special = {k: v for k, v in resources.items() if k not in ("cpu", "memory", "pods",
                                                                 "ephemeral-storage")}
    shown = special or {k: v for k, v in resources.items() if k in ("cpu", "memory")}
    return ",".join(f"{k.rsplit('/', 1)[-1]}={v}" for k, v in sorted(shown.items())) or "-"


def _condition(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any]:
    return next((c for c in conditions if c.get("type") == type_), {})


# ---------------------------------------------------------------------------- capacity


def capacity_rows(pools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (pool, domain) from the pools' status; an invalid pool or one without
    status yet is one row saying so."""
    rows = []
    for pool in sorted(pools, key=lambda p: p["metadata"]["name"]):
        name = pool["metadata"]["name"]
        status = pool.get("status") or {}
        conditions = status.get("conditions") or []
        valid = _condition(conditions, "Valid")
        provider = _condition(conditions, "ProviderReady")
        base = {"pool": name, "valid": valid.get("status", "Unknown"),
                "providerReady": provider.get("status", "Unknown")}
        if valid.get("status") == "False":
            rows.append({**base, "domain": "-", "problem": valid.get("message", "")})
            continue
        if not status.get("domains"):
            rows.append({**base, "domain": "-",
                         "problem": "no status yet (is Muster running?)"})
            continue
        for d in status["domains"]:
            rows.append({**base, **{k: v for k, v in d.items() if k != "labels"},
                         "domain": d.get("name", "-"), "labels": d.get("labels") or {}})
    return rows


@app.command()
def capacity(
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Per-domain capacity of every CapacityPool: nodes, Ready, booked, in flight, free,
    what Muster could still add."""
    from controller.kube.resources import CAPACITY_POOLS

    _check_kubeconfig(kubeconfig)

    async def work() -> list[dict[str, Any]]:
        kube = await _connect(kubeconfig, context)
        try:
            listing = await kube.list(CAPACITY_POOLS)
        finally:
            await kube.close()
        return capacity_rows(listing.get("items") or [])

    rows: list[dict[str, Any]] = _run(work())

    def table() -> None:
        if not rows:
            typer.echo("No CapacityPools.")
            return
        headers = ("POOL", "DOMAIN", "VALID", "NODES", "READY", "BOOKED", "IN-FLIGHT",
                   "FREE", "FREE-NODES", "PROVISIONABLE", "AVAILABLE", "STOCK-OUT-UNTIL")
        body = []
        problems = []
        for r in rows:
            if "problem" in r:
                body.append((r["pool"], "-", r["valid"], *["-"] * 9))
                problems.append(f"{r['pool']}: {r['problem']}")
                continue
            body.append((r["pool"], r["domain"], r["valid"], r["nodes"], r["readyNodes"],
                         r["bookedNodes"], r["inFlightNodes"], _short(r.get("free") or {}),
                         r["freeNodes"], r["provisionableNodes"], r["availableNodes"],
                         r.get("stockOutUntil") or "-"))
        typer.echo(table_text(headers, body))
        for line in problems:
            typer.echo(line)

    _emit({"domains": rows}, output, table)


# ---------------------------------------------------------------------------- fit


@dataclass(frozen=True)
class WhatIf:
    """A what-if plan, and the refused pools the gang waits for when it did not fit."""

    result: Plan | NoFit
    unusable_pools: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def plan_payload(result: Plan | NoFit | WhatIf) -> dict[str, Any]:
    """A plan or a shortfall as plain data (what ``-o json`` prints)."""
    from controller.fit.explain import shortfall
    from controller.fit.types import Plan

    unusable: Mapping[str, tuple[str, ...]] = {}
    if isinstance(result, WhatIf):
        unusable = result.unusable_pools
        result = result.result
    if isinstance(result, Plan):
        existing: dict[str, int] = {}
        for a in result.assignments:
            if a.node is not None:
                existing[a.node] = existing.get(a.node, 0) + a.pods
        return {
            "fits": True,
            "request": result.request,
            "mode": result.mode.value,
            "placements": [
                {"podSet": p.pod_set, "level": p.level, "domain": p.domain,
                 "domainLabels": dict(p.domain_labels), "domainsUsed": p.domains_used}
                for p in result.placements
            ],
            "existingNodes": dict(sorted(existing.items())),
            "newNodes": [
                {"pool": n.pool, "domain": dict(n.domain), "count": n.count,
                 "costPerHour": round(n.cost_per_hour, 4)}
                for n in result.new_nodes
            ],
            "newNodeCount": sum(n.count for n in result.new_nodes),
            "costPerHour": round(result.cost_per_hour, 4),
        }
    return {
        "fits": False,
        "request": result.request,
        "mode": result.mode.value,
        "permanent": result.permanent and not unusable,
        "unusablePools": {name: list(problems) for name, problems in unusable.items()},
        "shortfall": shortfall(result),
        "reasons": [{"code": r.code.value, "podSet": r.pod_set, "message": r.message,
                     "needed": r.needed, "best": r.best, "level": r.level,
                     "domain": r.domain} for r in result.reasons],
    }


def _print_plan(payload: Mapping[str, Any]) -> None:
    if payload["fits"]:
        typer.echo(f"FITS {payload['request']} (mode {payload['mode']}): "
                   f"{len(payload['existingNodes'])} existing node(s), "
                   f"{payload['newNodeCount']} new node(s), ${payload['costPerHour']:.2f}/h")
        typer.echo(table_text(
            ("POD SET", "LEVEL", "DOMAIN", "DOMAINS USED"),
            [(p["podSet"], (p["level"] or "-").rsplit("/", 1)[-1], p["domain"] or "-",
              p["domainsUsed"]) for p in payload["placements"]]))
        if payload["newNodes"]:
            typer.echo("Would buy:")
            typer.echo(table_text(
                ("POOL", "DOMAIN", "NODES", "$/H"),
                [(n["pool"], ",".join(f"{k.rsplit('/', 1)[-1]}={v}"
                                      for k, v in n["domain"].items()) or "-",
                  n["count"], f"{n['costPerHour']:.2f}") for n in payload["newNodes"]]))
        return
    unusable = payload.get("unusablePools") or {}
    if unusable:  # the controller's PoolUnusable: the fix is the pool's
        pools = "; ".join(f"CapacityPool {name} ({'; '.join(problems)})"
                          for name, problems in unusable.items())
        typer.echo(f"WAITS FOR POOL {payload['request']} (mode {payload['mode']}): {pools}. "
                   f"Without {'it' if len(unusable) == 1 else 'them'}: {payload['shortfall']}")
    else:
        verdict = "NEVER FITS" if payload["permanent"] else "DOES NOT FIT"
        typer.echo(f"{verdict} {payload['request']} (mode {payload['mode']}): "
                   f"{payload['shortfall']}")
    typer.echo(table_text(("REASON", "POD SET", "DETAIL"),
                          [(r["code"], r["podSet"] or "-", r["message"])
                           for r in payload["reasons"]]))


def job_documents(job: Mapping[str, Any], namespace: str) -> list[dict[str, Any]]:
    """A batch/v1 Job as the ProvisioningRequest and PodTemplate a gang of its pods would
    be: one pod set of ``parallelism`` pods (the pods running at once; Kueue asks for the
    same), the Job's pod template, its class from ``muster.dev/provisioning-class``."""
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    name = meta.get("name")
    if not name:
        raise PluginError("the Job has no metadata.name")
    template = spec.get("template")
    if not isinstance(template, dict):
        raise PluginError(f"Job {name}: spec.template is missing")
    parallelism = spec.get("parallelism", 1)
    completions = spec.get("completions")
    if not isinstance(parallelism, int) or parallelism < 1:
        raise PluginError(f"Job {name}: spec.parallelism must be a positive integer")
    if isinstance(completions, int) and completions >= 1:
        parallelism = min(parallelism, completions)
    from controller.config import ATOMIC_CLASS

    cls = (meta.get("annotations") or {}).get(JOB_CLASS_ANNOTATION, ATOMIC_CLASS)
    ns = meta.get("namespace") or namespace
    return [
        {"apiVersion": "v1", "kind": "PodTemplate",
         "metadata": {"name": f"{name}-pods", "namespace": ns}, "template": template},
        {"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
         "metadata": {"name": name, "namespace": ns},
         "spec": {"provisioningClassName": cls,
                  "podSets": [{"podTemplateRef": {"name": f"{name}-pods"},
                               "count": parallelism}]}},
    ]


def read_fit_file(path: Path, namespace: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The request and the PodTemplates given in ``path`` (a Job becomes both)."""
    from controller.inputs.snapshot import SnapshotError, load_documents

    try:
        docs = load_documents(path)
    except SnapshotError as exc:
        raise PluginError(str(exc)) from None
    jobs = [d for d in docs if d.get("kind") == "Job"]
    requests = [d for d in docs if d.get("kind") == "ProvisioningRequest"]
    if len(jobs) + len(requests) != 1:
        raise PluginError(f"{path}: expected one ProvisioningRequest or one batch/v1 Job, "
                          f"found {len(requests)} request(s) and {len(jobs)} Job(s)")
    if jobs:
        docs = job_documents(jobs[0], namespace)
    out_templates = []
    request: dict[str, Any] = {}
    for doc in docs:
        meta = doc.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise PluginError(f"{path}: {doc.get('kind')} metadata must be a mapping")
        meta.setdefault("namespace", namespace)
        if doc.get("kind") == "ProvisioningRequest":
            request = doc
        elif doc.get("kind") == "PodTemplate":
            out_templates.append(doc)
    return request, out_templates


async def what_if(
    state: ClusterState, config: MusterConfig, request: Mapping[str, Any],
    templates: Sequence[Mapping[str, Any]] = (), *, exclude: str | None = None,
) -> WhatIf:
    """Plan ``request`` against ``state`` as the controller's planner would (its templates
    from ``templates`` first, then the cluster's); nothing is written anywhere. A gang that
    does not fit and that a pool the provider refuses would serve waits for that pool's
    fix, as in the controller (``PoolUnusable``), rather than never fitting."""
    from controller.fit import PlanningPass
    from controller.fit.types import Plan
    from controller.reconcilers.provisioning.gang import Invalid, build_gang
    from controller.state.planner import pools_to_fix
    from controller.state.requests import RequestRecord

    for t in templates:
        state.upsert_template(dict(t), notify=False)
    view = RequestRecord.parse(dict(request))
    mode = config.classes.mode_for(view.class_name, view.parameters)
    if mode is None:
        raise PluginError(f"ProvisioningRequest {view.key}: Muster does not serve class "
                          f"{view.class_name!r} (with these parameters)")
    try:
        gang = build_gang(view, state, config)
    except Invalid as exc:
        raise PluginError(f"ProvisioningRequest {view.key}: {exc.detail}") from None
    now = datetime.now(UTC)
    result = PlanningPass(state.snapshot(exclude=exclude, now=now)).plan(gang, mode)
    if isinstance(result, Plan) or not state.pool_registry.unusable_pools():
        return WhatIf(result)
    with_unusable = PlanningPass(state.snapshot(exclude=exclude, now=now, with_unusable=True))
    unusable = state.pool_registry.unusable_pools()
    return WhatIf(result, pools_to_fix(with_unusable, unusable, gang, mode))


@app.command()
def fit(
    file: Annotated[Path, typer.Option("--filename", "-f",
                                       help="A ProvisioningRequest (+ its PodTemplates) or a "
                                       "batch/v1 Job.")],
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    config: ConfigOpt = None,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Would this gang fit now, where, and what would Muster buy? Planned on the live
    cluster with the controller's own engine and snapshot; nothing is created."""
    cfg = _run_sync(lambda: _config(config))
    _check_kubeconfig(kubeconfig)

    request, templates = _run_sync(lambda: read_fit_file(file, namespace))

    async def work() -> dict[str, Any]:
        kube = await _connect(kubeconfig, context)
        try:
            state = await live_state(kube, cfg)
        finally:
            await kube.close()
        return plan_payload(await what_if(state, cfg, request, templates))

    payload: dict[str, Any] = _run(work())
    _emit(payload, output, lambda: _print_plan(payload))
    raise typer.Exit(EXIT_FIT if payload["fits"] else EXIT_NO_FIT)


# ---------------------------------------------------------------------------- explain


def booking_payload(view: RequestRecord, state: ClusterState) -> dict[str, Any] | None:
    """The plan a booked (or acquiring) request holds, from its annotation, with the nodes
    acquired for it (found by their acquisition-key label)."""
    booking = view.booking
    if booking is None:
        return None
    payload = plan_payload(booking.plan)
    payload["attempt"] = booking.attempt
    acquired = set(booking.acquired_nodes)
    for group in booking.groups:
        acquired.update(state.objects.acquired_nodes(group.key))
    payload["acquiredNodes"] = sorted(acquired)
    return payload


@app.command()
def explain(
    request: Annotated[str, typer.Argument(help="The ProvisioningRequest's name.")],
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    config: ConfigOpt = None,
    output: OutputOpt = Output.TABLE,
) -> None:
    """A request's plan (where it is booked, which nodes) or why it waits (the shortfall
    the controller wrote), and what planning it again now would say."""
    cfg = _run_sync(lambda: _config(config))
    _check_kubeconfig(kubeconfig)

    async def work() -> dict[str, Any]:
        kube = await _connect(kubeconfig, context)
        try:
            state = await live_state(kube, cfg)
        finally:
            await kube.close()
        key = f"{namespace}/{request}"
        view = state.objects.request(key)
        if view is None:
            raise PluginError(f"provisioningrequest {key} not found")
        return await explain_payload(state, cfg, view)

    payload: dict[str, Any] = _run(work())
    _emit(payload, output, lambda: _print_explain(payload))


async def explain_payload(
    state: ClusterState, config: MusterConfig, view: RequestRecord
) -> dict[str, Any]:
    key = view.key
    conditions = {str(c.get("type")): {k: c.get(k) for k in ("status", "reason", "message")}
                  for c in view.conditions}
    payload: dict[str, Any] = {
        "request": key, "class": view.class_name, "phase": view.phase.value or "Pending",
        "conditions": conditions,
        "provisioningClassDetails": dict(view.class_details),
        "booking": booking_payload(view, state),
        "now": None,
    }
    provisioned = conditions.get("Provisioned", {}).get("status") == "True"
    failed = conditions.get("Failed", {}).get("status") == "True"
    if not provisioned and not failed and not view.deleting:
        try:
            payload["now"] = plan_payload(await what_if(state, config, view.body, exclude=key))
        except PluginError as exc:
            payload["now"] = {"error": str(exc)}
    return payload


def _print_explain(payload: Mapping[str, Any]) -> None:
    typer.echo(f"ProvisioningRequest {payload['request']} (class {payload['class']}, "
               f"phase {payload['phase']})")
    for type_, c in payload["conditions"].items():
        typer.echo(f"  {type_}={c['status']} {c['reason']}: {c['message']}")
    if payload["booking"] is not None:
        typer.echo("Booked plan:")
        _print_plan(payload["booking"])
        if payload["booking"]["acquiredNodes"]:
            typer.echo("Acquired nodes: " + ", ".join(payload["booking"]["acquiredNodes"]))
    now = payload.get("now")
    if now is not None:
        typer.echo("Planned again now:")
        if "error" in now:
            typer.echo(f"  {now['error']}")
        else:
            _print_plan(now)


if __name__ == "__main__":  # pragma: no cover
    main()
