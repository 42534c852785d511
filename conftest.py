"""Plugins every test directory shares: the real-cluster tier (one control plane and one
Muster process per session, and the per-tier summary lines)."""

pytest_plugins = ["e2e.real"]
