"""The event loop a service runs on: asyncio's own (the reference) or uvloop (libuv's loop).

Measured on this project's 2-core VM (docs/benchmarks.md): a wake-up of asyncio's selector
loop for a readable socket costs about twice uvloop's, and the transceiver on the native media
path wakes several hundred times a second at 100 sessions (the plane's reads, the 20 ms tick,
the agent frames link): the loop itself was about 15% of its CPU, uvloop took 5% off the
whole.
"""
from __future__ import annotations

from collections.abc import Callable

ASYNCIO, UVLOOP = "asyncio", "uvloop"
EVENT_LOOPS = (UVLOOP, ASYNCIO)


def loop_factory(name: str) -> Callable | None:
    """What ``asyncio.Runner(loop_factory=...)`` takes for ``name`` (None: asyncio's)."""
    if name == ASYNCIO:
        return None
    if name == UVLOOP:
        import uvloop

        return uvloop.new_event_loop
    raise ValueError(f"event loop must be one of {', '.join(EVENT_LOOPS)}")


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop this code runs on (for status and logs)."""
    import asyncio

    return UVLOOP if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else ASYNCIO
