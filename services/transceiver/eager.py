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


def write_now(send) -> bool:
    """Run an aiohttp WebSocket send coroutine in the caller, without a task.

    An uncompressed frame is written to the transport synchronously; the coroutine only
    suspends when it then waits for the transport to drain (the agent is not reading). The
    frame is in the transport's buffer by then, so that wait is given up rather than paid for
    with a task per frame. False when the frame could not be written (connection closing)."""
    try:
        run_now(send)
    except (ConnectionError, RuntimeError):
        return False
    return True
