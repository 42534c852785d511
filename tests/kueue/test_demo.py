"""``muster demo --kueue`` runs path B end to end and exits 0 once the gang runs."""

from __future__ import annotations

from typer.testing import CliRunner

from controller.cli import app


def test_demo_kueue_admits_the_gang_through_musters_check() -> None:
    result = CliRunner().invoke(app, ["demo", "--kueue", "--workers", "8", "--timeout", "60",
                                      "--latency", "0", "--ready-delay", "0"])
    assert result.exit_code == 0, result.output
    assert "AdmissionCheck muster-gang is Active" in result.output
    assert "the gang runs: all workers bound in rack" in result.output
    assert "update workers" in result.output
