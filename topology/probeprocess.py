"""Probes in a process of their own: calibration at load, beside the calls.

A probe's two threads run at SCHED_FIFO (probe.py) so it measures the links, not its own
wake-ups; their receive times need the interpreter's lock, so every thread that shares it
must run at their priority too, or one that holds it, preempted by the services, holds the
probes up. In the scenario runner that meant all of the runner's threads, whose periodic work
(a pass over /proc every 2 s: tens of ms) then stalled a core for every service and client:
the calls' lagged seconds gathered in the calibration's 36 s (docs/scenarios.md). Here the
probes share a lock only with each other, and the runner stays ordinary.

    results = probe_in_child([ProbeSpec(...), ...], parallel=3)

The child reads the specs as JSON on stdin and writes the results as JSON on stdout.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass

from topology.probe import ProbeResult, udp_probe


@dataclass(frozen=True)
class ProbeSpec:
    """One probe: ``udp_probe``'s arguments."""

    src_ns: str
    dst_ns: str
    dst_addr: str
    count: int
    rate: float
    size: int
    drain_s: float


def run_probes(specs: list[ProbeSpec], parallel: int,
               progress: Callable[[int, int], None] | None = None) -> list[ProbeResult]:
    """The probes, ``parallel`` at a time in this process, in the order of ``specs``;
    ``progress(done, total)`` after each. Ctrl-C (or any error) ends them now, not in
    count/rate seconds."""
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [pool.submit(udp_probe, s.src_ns, s.dst_ns, s.dst_addr, count=s.count,
                               rate=s.rate, size=s.size, drain_s=s.drain_s, stop=stop)
                   for s in specs]
        try:
            for done, _ in enumerate(as_completed(futures), start=1):
                if progress is not None:
                    progress(done, len(specs))
        except BaseException:
            stop.set()
            pool.shutdown(cancel_futures=True)
            raise
        return [f.result() for f in futures]


def probe_in_child(specs: list[ProbeSpec], parallel: int) -> list[ProbeResult]:
    """``run_probes`` in a child process; Ctrl-C here ends it at once."""
    child = subprocess.Popen([sys.executable, "-m", "topology.probeprocess", str(parallel)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        out, _ = child.communicate(json.dumps([asdict(s) for s in specs]))
    except BaseException:
        child.kill()
        child.wait()
        raise
    if child.returncode != 0:
        raise RuntimeError(f"the probe process exited with {child.returncode}")
    return [ProbeResult(r["sent"], [tuple(a) for a in r["arrivals"]], r["recv_ms"])
            for r in json.loads(out)]


def main() -> None:
    parallel = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    specs = [ProbeSpec(**s) for s in json.load(sys.stdin)]
    try:
        results = run_probes(specs, parallel)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent reports it
        sys.exit(130)
    json.dump([{"sent": r.sent, "arrivals": r.arrivals, "recv_ms": r.recv_ms}
               for r in results], sys.stdout)


if __name__ == "__main__":
    main()
