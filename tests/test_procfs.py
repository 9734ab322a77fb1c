"""services/procfs.py's CPU reading on real processes: a few milliseconds of work show (stat's
ticks are 10 ms), and the time of a thread that ended still counts."""
from __future__ import annotations

import subprocess
import sys

from services.procfs import precise_cpu_seconds

# spins for the CPU seconds it is given on each line, in the main thread or in a thread that
# then ends; says "done" after each
SPIN = """
import sys, threading, time
def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
for line in sys.stdin:
    kind, seconds = line.split()
    if kind == "thread":
        t = threading.Thread(target=spin, args=(float(seconds),)); t.start(); t.join()
    else:
        spin(float(seconds))
    print("done", flush=True)
"""


def _spin(proc, kind: str, seconds: float) -> None:
    proc.stdin.write(f"{kind} {seconds}\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "done\n"


def test_a_few_milliseconds_show_and_an_ended_threads_time_still_counts():
    proc = subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        _spin(proc, "main", 0.0)
        before = precise_cpu_seconds(proc.pid)
        _spin(proc, "main", 0.003)
        spent = precise_cpu_seconds(proc.pid) - before
        assert 0.0029 <= spent < 0.008, spent  # ticks would say 0 or 0.01
        before = precise_cpu_seconds(proc.pid)
        _spin(proc, "thread", 0.3)  # only stat's ticks still hold the ended thread's time
        assert precise_cpu_seconds(proc.pid) - before >= 0.28
    finally:
        proc.communicate("")
