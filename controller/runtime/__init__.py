"""The running controller's machinery, beside the cache: Lease leader election, the work
queue, the problem registry behind /readyz, and the process's memory settings."""
