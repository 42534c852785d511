"""Tests of the trace simulator (``muster simulate``)."""
