"""``python3 -m sandbox --port N --kubeconfig PATH --crds DIR``: run the sandbox API server
until interrupted (for kubectl experiments and the kind-less e2e run)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from sandbox.scheduler import SandboxScheduler
from sandbox.server import SandboxServer


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m sandbox", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = free)")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for this server here")
    parser.add_argument("--crds", type=Path, action="append", default=[],
                        help="directory of CRD YAML files to serve (repeatable)")
    parser.add_argument("--scheduler", action="store_true",
                        help="also run the sandbox scheduler (binds pending pods to nodes)")
    parser.add_argument("--seed", type=int, default=None, help="seed for uids and faults")
    return parser.parse_args(argv)


async def _run(args: argparse.Namespace) -> int:
    server = SandboxServer(port=args.port, seed=args.seed)
    for directory in args.crds:
        try:
            server.store.load_crd_dir(directory)
        except (FileNotFoundError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    await server.start()
    scheduler = SandboxScheduler(server.store) if args.scheduler else None
    if scheduler is not None:
        await scheduler.start()
    if args.kubeconfig:
        server.write_kubeconfig(args.kubeconfig)
        print(f"kubeconfig written to {args.kubeconfig}", flush=True)
    print(f"sandbox API server listening on {server.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if scheduler is not None:
        await scheduler.stop()
    await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(_run(_parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
