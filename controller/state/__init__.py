"""The watch-fed cluster cache, bookings, and the single planner that plans against one
snapshot per pass. Above ``fit`` (pure), below ``acquire`` and ``reconcilers``; no I/O of
its own beyond the watch feeds it is given a :class:`controller.kube.KubeClient` for."""
