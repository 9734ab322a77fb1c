"""Where the host's CPU went while an architecture's calls ran.

The testbed's own processes share the host with the world they emulate; when the lag watch
flags sessions (docs/logs.md, saturation), the next question is what the cores were doing.
``HostCpuWatch`` answers it from the kernel's own accounting, measured in the run: the host's
busy time is the window's wall time on every core minus the cores' idle time (``/proc/stat``,
which a tickless kernel measures exactly; its user and system counts are sampled at the tick
and miss the short runs these event loops make: 31% busy where the processes' own scheduler
time summed to 40%), and each group of processes' scheduler time
(``/proc/PID/task/*/schedstat``, every thread, nanoseconds). Steal and interrupt time are
``/proc/stat``'s tick samples: indications, not measurements.

The window opens when the first calls are due and closes at the last sample at which every
client process was still running (the calls' steady state, not the tail where clients end
one by one). What no group claims (kernel threads, interrupt work, other processes, the
watch's own reads) is ``other``.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from services.procfs import HostTimes, precise_cpu_seconds, process_tree

SAMPLE_EVERY_S = 2.0
# (monotonic, unix, the host's times, pid -> (group, CPU seconds))
_Reading = tuple[float, float, "HostTimes", dict[int, tuple[str, float]]]


def process_groups(roots: list[tuple[str, int | None]]) -> dict[str, list[int]]:
    """Each root's group: the root and every process below it (one pass over /proc). A
    process under two roots counts once, in the first root's group."""
    alive, children = process_tree()
    groups: dict[str, list[int]] = {}
    seen: set[int] = set()
    for group, root in roots:
        todo = [root] if root in alive and root not in seen else []
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            groups.setdefault(group, []).append(pid)
            todo.extend(children.get(pid, ()))
    return groups


@dataclass
class HostCpu:
    """One window's figures; percentages of ONE core (a 2-core host is 200% busy at most)."""

    seconds: float
    cpus: int
    busy_pct: float                 # wall time on every core minus idle and iowait
    steal_pct: float
    irq_pct: float
    groups: dict[str, float] = field(default_factory=dict)   # group -> % of a core
    other_pct: float = 0.0          # busy, but in no group
    start_unix: float = 0.0
    end_unix: float = 0.0
    idle_probe: dict | None = None  # scenarios/idleprobe.py over the window: its lagged seconds

    @property
    def busy_of_host_pct(self) -> float:
        """Busy as a share of all the host's cores."""
        return self.busy_pct / self.cpus if self.cpus else 0.0

    def whole_seconds(self) -> tuple[int, int]:
        """[first, last) of the wall-clock seconds wholly inside the window (the lag watch's
        windows are whole seconds)."""
        first = math.ceil(self.start_unix)
        return first, max(first, math.floor(self.end_unix))

    def to_dict(self) -> dict:
        return {**asdict(self), "busy_of_host_pct": round(self.busy_of_host_pct, 1)}


class HostCpuWatch:
    """``sample()`` often (it reads /proc at most every SAMPLE_EVERY_S); ``open()`` when the
    calls are due; ``result()`` after the calls. ``groups`` returns the pids of each group
    now (a service's workers included); ``clients_alive`` whether every client still runs."""

    def __init__(self, groups: Callable[[], dict[str, list[int]]],
                 clients_alive: Callable[[], bool],
                 read_host: Callable[[], HostTimes] = HostTimes.read,
                 read_cpu: Callable[[int], float] = precise_cpu_seconds,
                 every_s: float = SAMPLE_EVERY_S, clock: Callable[[], float] = time.monotonic,
                 cpus: int | None = None) -> None:
        self._groups = groups
        self._clock = clock
        self._cpus = cpus or os.cpu_count() or 1
        self._clients_alive = clients_alive
        self._read_host = read_host
        self._read_cpu = read_cpu
        self._every_s = every_s
        self._first: _Reading | None = None
        self._last: _Reading | None = None
        self._next = 0.0

    def _reading(self) -> "_Reading":
        cpu: dict[int, tuple[str, float]] = {}
        for group, pids in self._groups().items():
            for pid in pids:
                try:
                    cpu[pid] = (group, self._read_cpu(pid))
                except OSError:  # ended meanwhile
                    continue
        return self._clock(), time.time(), self._read_host(), cpu

    def open(self) -> None:
        """The window starts now."""
        self._first = self._last = self._reading()
        self._next = self._first[0] + self._every_s

    def sample(self) -> None:
        """A reading if the window is open, due, and every client still runs."""
        if self._first is None or self._clock() < self._next:
            return
        self._next = self._clock() + self._every_s
        if self._clients_alive():
            self._last = self._reading()

    @property
    def is_open(self) -> bool:
        return self._first is not None

    def result(self) -> HostCpu | None:
        """The window's figures; None before two readings."""
        if self._first is None or self._last is None or self._last is self._first:
            return None
        (t0, u0, h0, c0), (t1, u1, h1, c1) = self._first, self._last
        seconds = t1 - t0
        if seconds <= 0:
            return None
        groups: dict[str, float] = {}
        for pid, (group, end) in c1.items():
            start = c0.get(pid, (group, 0.0))[1]  # a process started in the window: all of it
            groups[group] = groups.get(group, 0.0) + max(0.0, end - start)
        pct = 100.0 / seconds
        busy = max(0.0, seconds * self._cpus - (h1.idle - h0.idle))
        claimed = sum(groups.values())
        return HostCpu(seconds=round(seconds, 3), cpus=self._cpus,
                       busy_pct=round(busy * pct, 1),
                       steal_pct=round((h1.steal - h0.steal) * pct, 1),
                       irq_pct=round((h1.irq - h0.irq) * pct, 1),
                       groups={g: round(v * pct, 1) for g, v in sorted(groups.items())},
                       other_pct=round(max(0.0, busy - claimed) * pct, 1),
                       start_unix=round(u0, 3), end_unix=round(u1, 3))
