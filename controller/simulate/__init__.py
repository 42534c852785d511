"""Trace-driven simulation of GPU provisioning strategies (``muster simulate``).

Replays the job arrivals of a real GPU trace against a seeded simulated cloud and measures,
per strategy, GPU-hours paid, used and stranded, job waits and jobs that never start. The
``muster`` and ``gang-no-topology`` strategies place jobs with the real fit engine
(:mod:`controller.fit`); ``pod-by-pod`` mimics cluster-autoscaler without it.

Modules: ``trace`` (CSV reading and sampling), ``cloud`` (stock, quota, boot latency),
``engine`` (event loop and shared mechanics), ``strategies``, ``metrics``, ``report``
(table, JSON, plot) and ``runner`` (runs the strategies on one trace).
"""
