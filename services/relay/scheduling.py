"""Where and how a relay worker runs: pinned to a CPU, optionally at real-time priority.

A worker pinned to a CPU still waits whenever the scheduler gives that CPU to someone else:
on the 2-core development VM the machine's own agent and kernel threads took it for 1-6 ms at
a time, far longer than the relay's own ~0.1 ms per batch (docs/hostile.md, "A core of its
own"). At real-time priority (SCHED_FIFO) the worker runs as soon as a datagram wakes it. It
sleeps in epoll whenever nothing is queued, and the kernel's real-time throttling
(kernel.sched_rt_runtime_us, 95% by default) keeps a busy worker from taking its CPU entirely.
"""
from __future__ import annotations

import os

from voiceedge.errors import ConfigError

_ONLINE = "/sys/devices/system/cpu/online"


def online_cpus() -> set[int]:
    """The host's online CPUs (not this process's affinity, which may be narrower)."""
    try:
        with open(_ONLINE) as f:
            text = f.read().strip()
    except OSError:
        return set(range(os.cpu_count() or 1))
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def check_realtime(priority: int) -> None:
    """ConfigError unless this process may run at SCHED_FIFO ``priority`` (tried, then undone)."""
    low, high = os.sched_get_priority_min(os.SCHED_FIFO), os.sched_get_priority_max(os.SCHED_FIFO)
    if not low <= priority <= high:
        raise ConfigError(f"--realtime {priority} is not a real-time priority ({low}-{high})")
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except PermissionError:
        raise ConfigError(f"--realtime {priority} needs root or CAP_SYS_NICE") from None
    os.sched_setscheduler(0, before[0], before[1])


def place_worker(cpu: int | None, realtime: int | None) -> None:
    """Pin the calling process to ``cpu`` and give it real-time priority ``realtime`` (each
    when set). Call before the worker starts threads: they inherit both."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    if realtime is not None:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(realtime))
