"""Plugins every test directory shares: the real-cluster tier (one control plane and one
Muster process per session, and the per-tier summary lines) and the cloud tier on it
(e2e/cloud/tier.py)."""

pytest_plugins = ["e2e.real", "e2e.cloud.tier"]
