"""Running a coroutine that never has to wait, in the caller, without a task.

Several of aiortc's and aiohttp's per-packet methods are coroutines only because they *may*
wait (a full transport, a video receiver's feedback); for this transceiver's audio they
finish without suspending. Driving them by hand saves a task and an event-loop turn per
packet; Python 3.12's eager tasks do the same, this runs on 3.11.
"""
from __future__ import annotations


def run_now(coro) -> bool:
    """Run ``coro`` until it returns (True) or first suspends (False: the rest of it is
    dropped, so use this only where that is acceptable). Its exceptions propagate."""
    try:
        coro.send(None)
    except StopIteration:
        return True
    coro.close()
    return False
