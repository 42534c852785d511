"""`muster demo`: the headline story runs end to end and says clearly when it cannot."""

from __future__ import annotations

from typer.testing import CliRunner

from controller.cli import app


def test_demo_runs_the_gang_and_exits_0() -> None:
    result = CliRunner().invoke(app, ["demo", "--latency", "0", "--ready-delay", "0.2"])
    assert result.exit_code == 0, result.output
    assert "every pod is bound" in result.output
    assert "CapacityIsProvisioned" in result.output


def test_demo_explains_a_gang_that_can_never_fit() -> None:
    result = CliRunner().invoke(app, ["demo", "--workers", "40", "--timeout", "20"])
    assert result.exit_code == 1
    assert "demo failed" in result.output and "never fit" in result.output
