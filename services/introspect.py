"""What a service process holds now, read from itself: open file descriptors, asyncio tasks, memory.

``snapshot()`` is cheap (one directory listing, one small /proc file, glibc's ``mallinfo2()``,
which walks malloc's free lists: under 1 ms in a transceiver after a peak of calls) and meant
for a service's ``/status`` or ``/metrics`` handler, where it runs on the event loop;
``metric_families`` turns it into Prometheus gauges for a custom collector. The hygiene benchmark
(bench/hostile/hygiene.py) reads them before and after thousands of sessions, asking for a full
garbage collection first (``collect``: tens of milliseconds of the event loop, so only on
request) so that ``python_blocks`` counts live objects, not garbage waiting for the collector,
and for malloc's free memory to be handed back to the system (``trim``) so that RSS no longer
counts what malloc keeps for later.

Memory, seen three ways: ``rss_bytes`` is every resident page (code, Python's and malloc's
heaps, and the free memory each keeps); ``python_blocks`` the objects in Python's own allocator
(its 1 MiB arenas, which malloc does not see); ``heap_in_use_bytes`` what C code, and Python's
objects over 512 bytes, have from malloc and not freed, over all of glibc's arenas and mmapped
chunks, and ``heap_free_bytes`` what malloc has been given back but keeps (fragmentation,
per-thread arenas). A leak grows the in-use figures; memory freed and kept grows only RSS and
``heap_free_bytes``.
"""
from __future__ import annotations

import asyncio
import ctypes
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
    "heap_in_use_bytes": "bytes malloc has handed out and not got back, all arenas and mmapped "
                         "chunks (glibc mallinfo2 uordblks + hblkhd)",
    "heap_free_bytes": "bytes freed to malloc that it keeps rather than return to the system "
                       "(glibc mallinfo2 fordblks)",
}


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _libc_function(name: str, restype, *argtypes):
    """``name`` from the C library this process runs on, or None (not glibc, or too old)."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        return None
    function.restype, function.argtypes = restype, argtypes
    return function


_mallinfo2 = _libc_function("mallinfo2", _Mallinfo2)
_malloc_trim = _libc_function("malloc_trim", ctypes.c_int, ctypes.c_size_t)


def heap() -> tuple[int, int] | tuple[None, None]:
    """malloc's (in-use, free but kept) bytes over all arenas; (None, None) without glibc's
    ``mallinfo2`` (musl, glibc < 2.33)."""
    if _mallinfo2 is None:
        return None, None
    info = _mallinfo2()
    return info.uordblks + info.hblkhd, info.fordblks


def trim_heap() -> bool:
    """Hand malloc's free memory back to the system (glibc ``malloc_trim(0)``, every arena);
    True if some was."""
    return bool(_malloc_trim(0)) if _malloc_trim is not None else False


def snapshot(collect: bool = False, trim: bool = False) -> dict[str, int | None]:
    """This process now: ``open_fds``, ``asyncio_tasks`` (None outside a running loop),
    ``rss_bytes``, ``rss_peak_bytes``, ``threads``, ``python_blocks`` (after a full garbage
    collection with ``collect``, frozen objects included: services/gcpolicy.py),
    ``heap_in_use_bytes``, ``heap_free_bytes`` (None without glibc); ``trim``: after
    ``trim_heap()``."""
    if collect:
        frozen = gc.get_freeze_count()
        gc.unfreeze()
        gc.collect()
        if frozen:
            gc.freeze()
    if trim:
        trim_heap()
    try:
        tasks: int | None = len(asyncio.all_tasks(asyncio.get_running_loop()))
    except RuntimeError:
        tasks = None
    status = procfs.status_fields()

    def in_bytes(key: str) -> int | None:
        value = procfs.kib(status, key)
        return None if value is None else value * 1024

    in_use, free = heap()
    return {"open_fds": procfs.open_fds(), "asyncio_tasks": tasks,
            "rss_bytes": in_bytes("VmRSS"), "rss_peak_bytes": in_bytes("VmHWM"),
            "threads": int(status.get("Threads", 0)) or None,
            "python_blocks": sys.getallocatedblocks(),
            "heap_in_use_bytes": in_use, "heap_free_bytes": free}


def query_flags(query) -> tuple[bool, bool]:
    """(``collect``, ``trim``) as a status or metrics request asks for them: ``?gc=1``,
    ``&trim=1``."""
    return query.get("gc") == "1", query.get("trim") == "1"


def metric_families(prefix: str, collect: bool = False, trim: bool = False):
    """``snapshot(collect, trim)`` as Prometheus gauges named ``{prefix}_process_{name}``
    (a collector's ``collect`` can ``yield from`` this)."""
    for name, value in snapshot(collect, trim).items():
        if value is not None:
            gauge = GaugeMetricFamily(f"{prefix}_process_{name}", HELP[name])
            gauge.add_metric([], value)
            yield gauge
