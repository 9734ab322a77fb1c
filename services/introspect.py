"""What a service process holds now, read from itself: open file descriptors, asyncio tasks, memory.

``snapshot()`` is cheap (one directory listing, one small /proc file) and meant for a service's
``/status`` or ``/metrics`` handler, where it runs on the event loop; ``metric_families`` turns
it into Prometheus gauges for a custom collector. The hygiene benchmark
(bench/hostile/hygiene.py) reads them before and after thousands of sessions, asking for a full
garbage collection first (``collect``: tens of milliseconds of the event loop, so only on
request) so that ``python_blocks`` counts live objects, not garbage waiting for the collector.
"""
from __future__ import annotations

import asyncio
import gc
import sys

from prometheus_client.core import GaugeMetricFamily

from services import procfs

HELP = {
    "open_fds": "file descriptors open in this process",
    "asyncio_tasks": "asyncio tasks not yet done on this process's event loop",
    "rss_bytes": "resident memory (VmRSS)",
    "rss_peak_bytes": "resident memory high-water mark (VmHWM)",
    "threads": "threads of this process",
    "python_blocks": "memory blocks Python's allocator has handed out and not got back (live "
                     "objects and uncollected garbage; unlike RSS, no allocator high-water)",
}


def snapshot(collect: bool = False) -> dict[str, int | None]:
    """This process now: ``open_fds``, ``asyncio_tasks`` (None outside a running loop),
    ``rss_bytes``, ``rss_peak_bytes``, ``threads``, ``python_blocks`` (after a full garbage
    collection with ``collect``)."""
    if collect:
        gc.collect()
    try:
        tasks: int | None = len(asyncio.all_tasks(asyncio.get_running_loop()))
    except RuntimeError:
        tasks = None
    status = procfs.status_fields()

    def in_bytes(key: str) -> int | None:
        value = procfs.kib(status, key)
        return None if value is None else value * 1024

    return {"open_fds": procfs.open_fds(), "asyncio_tasks": tasks,
            "rss_bytes": in_bytes("VmRSS"), "rss_peak_bytes": in_bytes("VmHWM"),
            "threads": int(status.get("Threads", 0)) or None,
            "python_blocks": sys.getallocatedblocks()}


def metric_families(prefix: str, collect: bool = False):
    """``snapshot(collect)`` as Prometheus gauges named ``{prefix}_process_{name}`` (a
    collector's ``collect`` can ``yield from`` this)."""
    for name, value in snapshot(collect).items():
        if value is not None:
            gauge = GaugeMetricFamily(f"{prefix}_process_{name}", HELP[name])
            gauge.add_metric([], value)
            yield gauge
