"""Muster's config: YAML plus MUSTER_* variables; mistakes stop start-up with the key named."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.config import ConfigError, load_config
from controller.fit.types import Mode
from e2e.cluster import HARNESS_VARIABLES


@pytest.fixture(autouse=True)
def _no_harness_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real tier's own MUSTER_CLUSTER_* variables (a cluster on other ports) are no
    Muster settings; these tests read the environment as Muster would."""
    for key in HARNESS_VARIABLES:
        monkeypatch.delenv(key, raising=False)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "muster.yaml"
    path.write_text(text)
    return path


def test_defaults_serve_muster_classes_only() -> None:
    cfg = load_config()
    assert cfg.classes.mode_for("check-capacity.muster.dev") is Mode.CHECK
    assert cfg.classes.mode_for("atomic-provisioning.muster.dev") is Mode.PROVISION
    assert cfg.classes.mode_for("check-capacity.autoscaling.x-k8s.io") is None
    assert cfg.classes.mode_for("queued-provisioning.gke.io") is None


def test_upstream_class_names_are_opt_in(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, "classes:\n  serve_upstream: true\n"))
    assert cfg.classes.mode_for("check-capacity.autoscaling.x-k8s.io") is Mode.CHECK
    assert cfg.classes.mode_for("best-effort-atomic-scale-up.autoscaling.x-k8s.io") is (
        Mode.PROVISION
    )


def test_environment_wins_over_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_BOOKING__DURATION_SECONDS", "42")
    text = "booking:\n  duration_seconds: 5\nretry: {max_attempts: 2}\n"
    cfg = load_config(_write(tmp_path, text))
    assert cfg.booking.duration_seconds == 42
    assert cfg.retry.max_attempts == 2


@pytest.mark.parametrize(
    ("text", "env", "words"),
    [
        pytest.param("bogus: 1\n", {}, "bogus: unknown setting", id="unknown-top-level-key"),
        pytest.param("retry: {max_atempts: 3}\n", {}, "retry.max_atempts: unknown setting",
                     id="typo-in-a-section"),
        pytest.param("booking: {duration_seconds: -1}\n", {}, "booking.duration_seconds",
                     id="negative-duration"),
        pytest.param("log_format: xml\n", {}, "log_format", id="bad-enum"),
        pytest.param("", {"MUSTER_RETRY__MAX_ATEMPTS": "3"}, "retry.max_atempts",
                     id="typo-in-env-nested"),
        pytest.param("", {"MUSTER_BOOKNIG": "3"}, "MUSTER_BOOKNIG: unknown setting",
                     id="typo-in-env-top"),
        pytest.param("- a\n- b\n", {}, "must hold a mapping", id="yaml-not-a-mapping"),
        pytest.param("retry: {initial_backoff_seconds: 100, max_backoff_seconds: 10}\n", {},
                     "exceeds max_backoff_seconds", id="backoff-order"),
        pytest.param(
            "classes: {check_capacity: [a.b], atomic: [a.b]}\n", {}, "both",
            id="class-served-twice",
        ),
    ],
)
def test_bad_config_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, env: dict[str, str], words: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text))
    assert words in str(err.value)


@pytest.mark.parametrize("key", [
    "MUSTER_AWS_REGION", "MUSTER_GCP_API_ENDPOINT", "MUSTER_CLUSTER_PORT_BASE",
    "MUSTER_CLUSTER_STATE", "MUSTER_KEEP_CLUSTER",
])
def test_variables_read_by_the_providers_or_the_tooling_are_not_config_typos(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MUSTER_AWS_REGION used to stop `muster run` ("unknown setting"), and the real-cluster
    # tier's MUSTER_CLUSTER_PORT_BASE every test process that loaded e2e/muster-e2e.yaml.
    monkeypatch.setenv(key, "1")
    assert load_config().cluster_name == "muster"


def test_a_typo_next_to_a_tooling_name_is_still_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_CLUSTER_NAMEE", "x")
    with pytest.raises(ConfigError, match="MUSTER_CLUSTER_NAMEE: unknown setting"):
        load_config()


def test_variables_of_musters_tooling_are_not_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second real control plane (docs/testing/real-cluster.md), its kept cluster, the
    # image and helm caches, the GCP provider's own settings: set while the e2e tier loads
    # e2e/muster-e2e.yaml in the test process, or beside `muster run`.
    for key, value in (("MUSTER_CLUSTER_PORT_BASE", "27400"), ("MUSTER_CLUSTER_STATE", "/x"),
                       ("MUSTER_CLUSTER_KCM_API_QPS", "200"), ("MUSTER_KEEP_CLUSTER", "1"),
                       ("MUSTER_CACHE", "/c"), ("MUSTER_GCP_API_ENDPOINT", "http://x"),
                       ("MUSTER_BENCH_SANDBOX_PREFIX", "")):
        monkeypatch.setenv(key, value)
    assert load_config(_write(tmp_path, "cluster_name: x\n")).cluster_name == "x"
    monkeypatch.setenv("MUSTER_CLUSTER_NAMES", "y")
    with pytest.raises(ConfigError, match="MUSTER_CLUSTER_NAMES: unknown setting"):
        load_config(_write(tmp_path, ""))


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")


def test_backoff_doubles_up_to_the_cap() -> None:
    cfg = load_config()
    delays = [cfg.retry.backoff(a) for a in range(1, 8)]
    assert delays[:3] == [10, 20, 40]
    assert max(delays) == cfg.retry.max_backoff_seconds


def test_e2e_config_file_is_valid() -> None:
    cfg = load_config(Path(__file__).resolve().parents[1] / "e2e" / "muster-e2e.yaml")
    # Short timers: a scenario waits seconds for a booking to end, not the default 10 min.
    assert cfg.booking.duration_seconds <= 60 < load_config().booking.duration_seconds


def test_the_sample_config_is_the_defaults() -> None:
    sample = load_config(Path(__file__).resolve().parents[1] / "config" / "muster.yaml")
    assert sample == load_config()


def test_processor_instance_partitions_the_classes_like_cluster_autoscaler() -> None:
    from controller.config import ClassesConfig
    from controller.fit import Mode

    default = ClassesConfig()
    assert default.mode_for("check-capacity.muster.dev", {}) is Mode.CHECK
    assert default.mode_for("check-capacity.muster.dev", {"processorInstance": "b"}) is None
    assert default.mode_for("atomic-provisioning.muster.dev", {}) is Mode.PROVISION
    b = ClassesConfig(processor_instance="b")
    assert b.mode_for("check-capacity.muster.dev", {"processorInstance": "b"}) is Mode.CHECK
    assert b.mode_for("check-capacity.muster.dev", {}) is None
    # An instance dedicated to check-capacity leaves atomic requests to the others.
    assert b.mode_for("atomic-provisioning.muster.dev", {}) is None


def test_every_variable_of_the_cluster_harness_is_set_aside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # MUSTER_CLUSTER_INSTALL=chart was refused as an unknown setting by every in-process
    # `muster fit` of the real tier (the scheduler oracle saw all its cases refused).
    from e2e.cluster import HARNESS_VARIABLES

    for key in HARNESS_VARIABLES:
        monkeypatch.setenv(key, "1")
    assert load_config().cluster_name == "muster"
