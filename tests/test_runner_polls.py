"""What the runner polls while the calls run, and how little each poll costs: the results
files read as they grow, the edge's bindings read at peaks and every few seconds."""
from __future__ import annotations

import json

from scenarios.ports import UdpBinding
from scenarios.runner import BINDINGS_EVERY_S, ResultCount, _PeakWatch


def test_results_are_counted_once_each_and_a_line_being_written_waits(tmp_path):
    a, b = tmp_path / "sessions-apac-se.jsonl", tmp_path / "sessions-in.jsonl"
    a.write_text(json.dumps({"ok": True}) + "\n" + json.dumps({"ok": False}) + "\n")
    count = ResultCount(tmp_path)
    assert count.poll() == (2, 1)
    assert count.poll() == (2, 1)                     # nothing new: nothing counted again
    with a.open("a") as f:
        f.write(json.dumps({"ok": True}) + "\n" + '{"ok": tr')   # the client mid-line
    b.write_text(json.dumps({"ok": True}) + "\n")
    assert count.poll() == (4, 1)
    with a.open("a") as f:
        f.write('ue}\n')
    assert count.poll() == (5, 1)


class _Edge:
    """The two things a peak watch asks an edge, counted."""

    def __init__(self) -> None:
        self.reads = 0
        self.ports = 0

    def live_session_sources(self):
        return []

    def public_bindings(self):
        self.reads += 1
        return [UdpBinding("203.0.113.10", 40000 + i, 1, i, "transceiver", "c1")
                for i in range(self.ports)]


def test_bindings_are_read_at_each_new_peak_and_every_few_seconds_between():
    edge = _Edge()
    watch = _PeakWatch(edge)
    t = 1000.0
    for live in (1, 2, 3):                      # the ramp: every new peak is read at once
        watch._live = {"t": live}
        edge.ports = live
        watch.sample(now=t)
        t += 0.5
    assert edge.reads == 3 and (watch.peak_sessions, watch.ports_at_peak) == (3, 3)
    watch._live = {"t": 2}
    edge.ports = 7                              # more ports than at the peak, between peaks
    for _ in range(int(BINDINGS_EVERY_S / 0.5) - 1):
        watch.sample(now=t)
        t += 0.5
    assert edge.reads == 3 and watch.ports_max == 3   # not read again yet
    watch.sample(now=t)
    assert edge.reads == 4 and watch.ports_max == 7 and watch.ports_at_peak == 3
    watch._live = {"t": 4}
    watch.sample(now=t + 0.5)                   # a new peak does not wait
    assert edge.reads == 5 and (watch.peak_sessions, watch.ports_at_peak) == (4, 7)
