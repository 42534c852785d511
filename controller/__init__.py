"""Muster: gang-atomic, topology-aware provisioning for Kubernetes.

Layers, outermost first (checked by import-linter, see pyproject.toml):
``reconcilers`` (the per-request service) > ``acquire`` (all-or-nothing provider calls) >
``state`` (watch-fed cache, snapshots) > ``fit`` (pure placement engine) >
``api`` (pydantic models).
"""

__version__ = "0.1.0"
