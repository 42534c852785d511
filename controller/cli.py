"""``muster`` command line: one typer app; each sub-command lives in its own module and
imports its heavy dependencies lazily so ``muster fit`` starts fast."""

from __future__ import annotations

from typing import Annotated

import typer

from controller import __version__
from controller.commands.demo import demo_command
from controller.commands.fit import fit_command
from controller.commands.run import run_command
from controller.commands.simulate import simulate_command

app = typer.Typer(
    name="muster",
    help="Gang-atomic, topology-aware provisioning for Kubernetes.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True,
                     help="Print Muster's version and exit."),
    ] = False,
) -> None:
    """Gang-atomic, topology-aware provisioning for Kubernetes."""


@app.command()
def version() -> None:
    """Print Muster's version."""
    typer.echo(__version__)


app.command("fit")(fit_command)
app.command("demo")(demo_command)
app.command("run")(run_command)
app.command("simulate")(simulate_command)


if __name__ == "__main__":  # pragma: no cover
    app()
