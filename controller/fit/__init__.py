"""The fit engine: where does a whole gang fit, on existing nodes plus new capacity.

Pure: no I/O, no clock, no randomness, no Kubernetes client (checked by import-linter).
Entry point: :func:`plan`.
"""
