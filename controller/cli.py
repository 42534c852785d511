"""``muster`` command line: one typer app; each sub-command lives in its own module and
imports its heavy dependencies lazily so ``muster fit`` starts fast."""

from __future__ import annotations

import sys
from collections.abc import Sequence
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


EXIT_USAGE = 2


def cli(argv: Sequence[str] | None = None) -> None:
    """The ``muster`` command (``project.scripts``). A usage error (an unknown command or
    option, a missing or invalid argument) is one line on stderr naming it, and exit 2, as
    every other bad input; typer's own rendering is a box of many lines."""
    from typer._click import exceptions as click_errors  # typer's vendored click

    try:
        code = app(args=list(argv) if argv is not None else None, standalone_mode=False,
                   prog_name="muster")
    except click_errors.NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx is not None else "muster --help")
        sys.exit(EXIT_USAGE)
    except click_errors.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "muster"
        text = " ".join(exc.format_message().split())
        typer.echo(f"error: {text} (see '{where} --help')", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    cli()
