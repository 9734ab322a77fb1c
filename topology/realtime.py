"""Real-time priority for the emulated wire: the impairment engine and calibration's probes
run at SCHED_FIFO so the emulated hosts wait for the links, not the other way round
(docs/impairment.md, "The wire first")."""
from __future__ import annotations

import os


def try_realtime(priority: int) -> int:
    """Run the calling thread at SCHED_FIFO ``priority`` (Linux schedules threads; a process
    that calls it before starting threads passes it on). Returns ``priority``, or 0 where it is
    refused (no root or CAP_SYS_NICE): the caller then runs ordinary."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except PermissionError:
        return 0
    return priority
