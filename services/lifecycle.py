"""Running a service until it is told to stop."""
from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from services.lag import LoopLagMonitor


def serve_until_signal(make_server: Callable[[], AbstractAsyncContextManager],
                       logger: logging.Logger | None = None,
                       loop_factory: Callable | None = None) -> None:
    """Run ``async with make_server():`` until SIGINT or SIGTERM, then leave the block (which
    stops the service cleanly). The event loop's lag is watched all along (services/lag.py)
    and logged to ``logger``: on the server's ``lag_clock`` when it has one (a 20 ms clock its
    loop keeps anyway), else on a timer of the monitor's own. ``loop_factory``: the event
    loop to run on (services/eventloops.py; None: asyncio's)."""

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with LoopLagMonitor(logger or logging.getLogger("voiceedge.lag")) as monitor:
            async with make_server() as server:
                clock = getattr(server, "lag_clock", None)
                if clock is not None:
                    monitor.follow(clock)
                await stop.wait()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve())
