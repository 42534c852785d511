"""``muster fit``: ask the fit engine where a ProvisioningRequest's gang would go.

Reads YAML files (request + its PodTemplates, cluster Nodes and bound Pods, CapacityPools),
builds the same Snapshot the controller would, calls :func:`controller.fit.plan` and prints
the plan or the NoFit reasons. Exit codes: 0 fits, 1 does not fit, 2 bad input.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from controller.fit import NoFit, Plan

EXIT_FIT, EXIT_NO_FIT, EXIT_BAD_INPUT = 0, 1, 2
MAX_ROWS = 40
"""Assignment rows printed before the table is cut short (``--json`` has them all)."""


class ModeOption(enum.StrEnum):
    AUTO = "auto"
    CHECK = "check"
    PROVISION = "provision"


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_asdict"):  # NamedTuple (DRA results)
        return {k: _jsonable(v) for k, v in value._asdict().items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _labels(domain: Mapping[str, str]) -> str:
    return ",".join(f"{k.rsplit('/', 1)[-1]}={v}" for k, v in domain.items()) or "-"


def _print_plan(result: Plan, console: Console) -> None:
    from rich.table import Table

    new = sum(n.count for n in result.new_nodes)
    console.print(
        f"[bold green]FITS[/] {result.request} (mode {result.mode.value}): "
        f"{len(result.assignments)} placements, {new} new nodes, "
        f"${result.cost_per_hour:.2f}/h"
    )
    sets = Table(title="Pod sets")
    for col in ("Pod set", "Level", "Domain", "Domains used"):
        sets.add_column(col)
    for p in result.placements:
        sets.add_row(p.pod_set, p.level or "-", _labels(p.domain_labels) if p.domain_labels
                     else (p.domain or "-"), str(p.domains_used))
    console.print(sets)
    table = Table(title="Assignments")
    with_devices = any(a.devices for a in result.assignments)
    for col in ("Pod set", "Node", "Pods", "Domain"):
        table.add_column(col)
    if with_devices:
        table.add_column("Devices (per pod)", overflow="fold")
    for a in result.assignments[:MAX_ROWS]:
        where = a.node if a.node else (
            f"new {a.new_node.pool}#{a.new_node.index}" if a.new_node else "?"
        )
        devices = (" ".join("+".join(r.device for c in pod for r in c.results)
                            for pod in a.devices),)
        table.add_row(a.pod_set, where, str(a.pods), _labels(a.domain),
                      *(devices if with_devices else ()))
    hidden = len(result.assignments) - MAX_ROWS
    if hidden > 0:
        table.caption = f"{hidden} more assignments not shown (use --json)"
    console.print(table)
    if result.new_nodes:
        nodes = Table(title="New nodes")
        for col in ("Pool", "Domain", "Nodes", "$/h"):
            nodes.add_column(col)
        for n in result.new_nodes:
            nodes.add_row(n.pool, _labels(n.domain), str(n.count), f"{n.cost_per_hour:.2f}")
        console.print(nodes)


def _print_nofit(result: NoFit, console: Console) -> None:
    from rich.table import Table

    refused = any(r.code == "Unsupported" for r in result.reasons)
    verdict = "REFUSED" if refused else "NEVER FITS" if result.permanent else "DOES NOT FIT"
    console.print(f"[bold red]{verdict}[/] {result.request} (mode {result.mode.value})")
    table = Table(title="Reasons")
    for col in ("Reason", "Pod set", "Detail"):
        table.add_column(col)
    for r in result.reasons:
        table.add_row(r.code.value, r.pod_set or "-", r.message)
    console.print(table)


_DRA = {"DeviceClass", "ResourceClaim", "ResourceClaimTemplate"}
SLOTS = {
    # slot: (what it takes, kinds only it takes, kinds it accepts)
    "REQUEST": ("the request and its PodTemplates (the first argument)",
                {"ProvisioningRequest", "PodTemplate"},
                {"ProvisioningRequest", "PodTemplate", *_DRA}),
    "--snapshot": ("the cluster's Nodes and Pods (--snapshot)",
                   {"Node", "Pod", "ResourceSlice"},
                   {"Node", "Pod", "ResourceSlice", "CapacityPool", *_DRA}),
    "--pools": ("CapacityPools (--pools)", {"CapacityPool"}, {"CapacityPool"}),
}
"""What each file of ``muster fit`` holds: a file holding another slot's kinds was given in
the wrong place, and is named as such rather than read as an empty request or cluster."""


def _slot_problem(slot: str, path: Path | None, docs: list[dict[str, Any]]) -> str | None:
    """Why ``docs`` (the file given as ``slot``) are not what that slot takes, or None."""
    kinds = {str(d.get("kind")) for d in docs}
    what, _, accepted = SLOTS[slot]
    for other, (theirs, only, _) in SLOTS.items():
        misplaced = sorted((kinds & only) - accepted)
        if other != slot and misplaced:
            return (f"{slot} {path} holds {', '.join(misplaced)}: that file belongs in "
                    f"{theirs}, and {slot} takes {what}")
    return None


def _unserved(name: str, class_name: str, parameters: Mapping[str, str] | None,
              classes: Any) -> str:
    from controller.config import UPSTREAM_ATOMIC_CLASS, UPSTREAM_CHECK_CAPACITY_CLASS

    served = [*classes.check_capacity, *classes.atomic]
    if classes.serve_upstream:
        served += [UPSTREAM_CHECK_CAPACITY_CLASS, UPSTREAM_ATOMIC_CLASS]
    if class_name in served:
        from controller.api.parameters import processor_instance

        instance = processor_instance(parameters or {})
        return (f"ProvisioningRequest {name}: class {class_name} with processorInstance "
                f"{instance!r} is left to another Muster instance (this one: "
                f"classes.processor_instance {classes.processor_instance!r}); the controller "
                "would not plan it (--mode plans it anyway)")
    return (f"ProvisioningRequest {name}: spec.provisioningClassName {class_name!r} is not "
            f"served by Muster (served: {', '.join(served)}); the controller would ignore it "
            "(--mode plans it anyway)")


def fit_command(
    request: Annotated[Path, typer.Argument(help="ProvisioningRequest and its PodTemplates.")],
    snapshot: Annotated[
        Path, typer.Option("--snapshot", "-s", help="Nodes (and bound Pods) of the cluster.")
    ],
    pools: Annotated[
        Path | None, typer.Option("--pools", "-p", help="CapacityPools Muster may grow.")
    ] = None,
    mode: Annotated[
        ModeOption,
        typer.Option(help="check: existing nodes only; provision: plus pools; auto: from the "
                     "request's provisioningClassName."),
    ] = ModeOption.AUTO,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    levels: Annotated[
        str | None,
        typer.Option(help="Topology level labels, top to bottom, comma separated (default: "
                     "the config's topology.levels)."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Muster's YAML config (as for muster run): the "
                     "classes it serves and its topology levels."),
    ] = None,
) -> None:
    """Plan where a ProvisioningRequest's whole gang fits, or say why it cannot."""
    # Imported here so other sub-commands start without pydantic models and the engine.
    from rich.console import Console

    from controller.config import ConfigError, load_config
    from controller.fit import Mode, Plan, plan
    from controller.inputs.snapshot import (
        SnapshotError,
        load_documents,
        request_from_documents,
        snapshot_from_documents,
    )

    err = Console(stderr=True)

    def bad_input(text: str) -> typer.Exit:
        err.print(f"muster fit: {text}", markup=False, highlight=False, soft_wrap=True)
        return typer.Exit(EXIT_BAD_INPUT)

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        raise bad_input(" ".join(str(exc).split())) from None
    level_keys = tuple(x.strip() for x in levels.split(",") if x.strip()) if levels else (
        tuple(cfg.topology.levels)
    )
    try:
        cluster = load_documents(snapshot)
        request_docs = load_documents(request)
        pool_docs = load_documents(pools) if pools else []
        for problem in (_slot_problem("REQUEST", request, request_docs),
                        _slot_problem("--snapshot", snapshot, cluster),
                        _slot_problem("--pools", pools, pool_docs) if pools else None):
            if problem:
                raise SnapshotError(problem)
        pr, gang = request_from_documents(request_docs, level_keys, cluster)
        snap = snapshot_from_documents(cluster, pool_docs, level_keys)
    except SnapshotError as exc:
        raise bad_input(str(exc)) from None
    served = cfg.classes.mode_for(pr.spec.provisioning_class_name, pr.spec.parameters)
    if mode is ModeOption.AUTO:
        if served is None:
            raise bad_input(_unserved(pr.metadata.name, pr.spec.provisioning_class_name,
                                      pr.spec.parameters, cfg.classes))
        chosen = served
    else:
        chosen = Mode(mode.value)
    result = plan(gang, snap, chosen)
    if as_json:
        payload = {"fits": isinstance(result, Plan), **_jsonable(result)}
        if not isinstance(result, Plan):
            payload["permanent"] = result.permanent
        typer.echo(json.dumps(payload, indent=2, sort_keys=True))
    else:
        # A terminal gets its own width; pipes and files get wide lines rather than wraps.
        console = Console(width=None if sys.stdout.isatty() else 160)
        if isinstance(result, Plan):
            _print_plan(result, console)
        else:
            _print_nofit(result, console)
    raise typer.Exit(EXIT_FIT if isinstance(result, Plan) else EXIT_NO_FIT)
