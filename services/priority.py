"""Stepping down from the real-time priority a run starts a process at (scenarios/priorities.py
starts the edge's services and the load clients under ``chrt --fifo``)."""
from __future__ import annotations

import os


def step_down() -> int:
    """Every thread of this process back to ordinary scheduling; returns how many were at a
    real-time priority. For work after the measured part: a client's exit frees its whole heap
    (150-300 ms here), which at a real-time priority holds a core from other processes of the
    same priority, and they never preempt it. Lowering one's own priority needs no privilege."""
    lowered = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            if os.sched_getscheduler(int(tid)) in (os.SCHED_FIFO, os.SCHED_RR):
                os.sched_setscheduler(int(tid), os.SCHED_OTHER, os.sched_param(0))
                lowered += 1
        except OSError:  # a thread that ended meanwhile
            continue
    return lowered
