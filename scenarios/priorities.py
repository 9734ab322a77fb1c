"""Who runs first when the emulated world shares two cores: the wire, then the edge, then the
callers.

In production the edge's services have hosts of their own; here they share the machine with
the load clients, and on an ordinary (CFS) schedule a service woken by a packet waits behind
whatever else is runnable: at `REGION=all` a process that does nothing but sleep 20 ms woke
5 ms late or more in 19-31 of 61 seconds, and the transceivers and agents logged lagged seconds
in bursts, host-wide stalls rather than work of their own (docs/scenarios.md). So a scenario
runs its processes at SCHED_FIFO, in the order of what they are:

- the impairment engine (the wire: topology/impairment, 20), the kernel's softirq threads that
  carry packets between the emulated hosts (``softirq_threads``, 15) and calibration's probes
  (10);
- the edge's services: fronts, relays, transceivers, agents, Redis, TURN servers (``services``);
- the aiortc load clients (``clients``), below the edge they measure and above everything else;
- the rest ordinary: the scenario runner, Chromium (its renderer would hold a core at a
  real-time priority).

A real-time task runs until it blocks; every one of these is an event loop that does a few
milliseconds of work and waits again, and the kernel keeps 5% of every second for ordinary
tasks whatever they do. The lag watch (services/lag.py) is unchanged: a process still late on
its 20 ms tick flags the sessions it carried.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from voiceedge.errors import ConfigError
from services.relay.scheduling import check_realtime

PROBES = 10   # topology/probe.py's PROBE_REALTIME: the edge's services stay below it
SOFTIRQ = 15  # the kernel's packet work: above the probes, below the engine (20)


@dataclass(frozen=True)
class Priorities:
    """SCHED_FIFO priorities of a run's services and load clients (0: ordinary)."""

    services: int = 5
    clients: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.clients <= self.services < PROBES:
            raise ValueError(f"0 <= clients <= services < {PROBES} (the calibration probes' "
                             f"priority): services {self.services}, clients {self.clients}")

    @classmethod
    def parse(cls, value) -> "Priorities":
        """A scenario's ``realtime``: ``false`` (everything ordinary), ``true`` (the defaults)
        or ``{services: N, clients: M}``."""
        if value is True:
            return cls()
        if value is False:
            return cls(0, 0)
        if not isinstance(value, dict) or set(value) - {"services", "clients"}:
            raise ValueError("true, false or {services: N, clients: M}")
        defaults = cls()
        numbers = {k: value.get(k, getattr(defaults, k)) for k in ("services", "clients")}
        if any(not isinstance(v, int) or isinstance(v, bool) for v in numbers.values()):
            raise ValueError("services and clients are whole numbers")
        return cls(**numbers)

    @property
    def ordinary(self) -> bool:
        return self.services == 0 and self.clients == 0

    def usable(self) -> tuple["Priorities", str]:
        """These priorities if this process may give them (root or CAP_SYS_NICE), else
        ordinary ones and why."""
        if self.ordinary:
            return self, ""
        try:
            check_realtime(self.services)
        except ConfigError as exc:
            return Priorities(0, 0), str(exc).replace("--realtime", "SCHED_FIFO priority")
        return self, ""


class Raised:
    """``with Raised(tids, priority):`` the threads ``tids`` at SCHED_FIFO ``priority`` for the
    block, then as they were (0: left alone). Threads that end meanwhile are skipped."""

    def __init__(self, tids: list[int], priority: int) -> None:
        self.tids = tids
        self.priority = priority
        self.saved: dict[int, tuple[int, int]] = {}   # tid -> (policy, priority) before

    def __enter__(self) -> "Raised":
        if self.priority:
            for tid in self.tids:
                try:
                    before = os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority
                    os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(self.priority))
                except (ProcessLookupError, PermissionError):
                    continue
                self.saved[tid] = before
        return self

    def __exit__(self, *exc) -> None:
        for tid, (policy, priority) in self.saved.items():
            try:
                os.sched_setscheduler(tid, policy, os.sched_param(priority))
            except (ProcessLookupError, PermissionError):
                pass
        self.saved.clear()


def softirq_threads() -> list[int]:
    """The kernel's ``ksoftirqd/N`` threads. Under load the kernel hands them its pending
    packet work (every datagram between the emulated hosts crosses veth pairs in softirq
    context); at an ordinary priority, with the services and clients at real-time ones, they
    waited 133 ms a second on the run queue (p50; p90 336 ms) at REGION=all. Run them with
    the wire (``SOFTIRQ``) for a run: ``Raised(softirq_threads(), SOFTIRQ)``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as comm:
                    if comm.read().startswith("ksoftirqd/"):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids
