"""Foundations every layer may use and that import nothing of Muster's: the clock, condition
and decision-log helpers, metrics, the shared label keys, the problem log and the test-only
crash points (the providers use some of these too)."""
