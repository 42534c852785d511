"""All-or-nothing acquisition through providers: idempotency keys, rollback of every group
on any failure, and the collector that releases orphaned and idle nodes."""
