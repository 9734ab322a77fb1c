"""Resource hygiene (bench/hostile/hygiene.py): sessions, complete or failed half-way, leave the
edge's processes as they found them. The quick run needs root (a lab namespace) and starts the
real edge; the bound logic and services/introspect.py are checked on their own."""
from __future__ import annotations

import asyncio
import ctypes
import json
import os
from collections import Counter

import pytest

from bench.hostile.hygiene import (HALFWAY_KINDS, HygieneConfig, lines, run, settled,
                                   violations)
from services import introspect


def test_introspect_counts_this_process():
    outside = introspect.snapshot()
    assert outside["asyncio_tasks"] is None
    assert outside["open_fds"] > 0 and outside["rss_bytes"] > 0 and outside["threads"] >= 1
    assert outside["python_blocks"] > 0

    async def inside():
        before = introspect.snapshot()
        extra = [asyncio.create_task(asyncio.sleep(1)) for _ in range(3)]
        r, w = os.pipe()
        during = introspect.snapshot()
        os.close(r), os.close(w)
        for task in extra:
            task.cancel()
        return before, during

    before, during = asyncio.run(inside())
    assert during["asyncio_tasks"] == before["asyncio_tasks"] + 3
    assert during["open_fds"] == before["open_fds"] + 2
    names = {m.name for m in introspect.metric_families("voiceedge_x")}
    assert "voiceedge_x_process_asyncio_tasks" not in names  # no loop here: not reported
    assert {"voiceedge_x_process_open_fds", "voiceedge_x_process_rss_bytes",
            "voiceedge_x_process_heap_in_use_bytes",
            "voiceedge_x_process_heap_free_bytes"} <= names


MIB = 1 << 20


def test_the_heap_in_use_counts_what_is_malloced_and_trim_returns_what_is_kept():
    """malloc'd and not freed: in use; freed but kept by glibc (a chunk still in use above
    them stops the heap from shrinking): RSS and free, not in use, until ``trim``."""
    if introspect.heap() == (None, None):
        pytest.skip("no glibc mallinfo2 here")
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    start = introspect.snapshot(trim=True)
    chunks = [libc.malloc(4096) for _ in range(8192)]  # 32 MiB, under the mmap threshold
    for chunk in chunks:
        ctypes.memset(chunk, 1, 4096)  # touched: resident
    held = introspect.snapshot()
    assert held["heap_in_use_bytes"] - start["heap_in_use_bytes"] >= 32 * MIB
    assert held["rss_bytes"] - start["rss_bytes"] >= 30 * MIB
    for chunk in chunks[:-1]:
        libc.free(chunk)
    kept = introspect.snapshot()
    assert abs(kept["heap_in_use_bytes"] - start["heap_in_use_bytes"]) < 2 * MIB  # no leak
    assert kept["heap_free_bytes"] >= 30 * MIB  # but glibc keeps it...
    assert kept["rss_bytes"] - start["rss_bytes"] >= 28 * MIB  # ...resident
    trimmed = introspect.snapshot(trim=True)
    assert trimmed["rss_bytes"] - start["rss_bytes"] < 4 * MIB  # handed back
    libc.free(chunks[-1])


def _sample(**changes) -> dict:
    base = {"relay": {"fds": 20, "rss_kib": 60000, "flows_active": 0, "flows_pending": 0},
            "transceiver": {"fds": 18, "rss_kib": 80000, "rss_trimmed_kib": 79000,
                            "heap_kib": 14000, "heap_free_kib": 1000, "tasks": 14,
                            "sessions": 0, "mux_ufrags": 0, "mux_hop_cache": 0},
            "signaling": {"fds": 17, "rss_kib": 39000, "rss_trimmed_kib": 38500,
                          "heap_kib": 9000, "tasks": None, "warm_connections": 9},
            "agent": {"fds": 7, "rss_kib": 50000, "rss_trimmed_kib": 49500, "heap_kib": 11000,
                      "tasks": 4, "sessions": 0}}
    for key, value in changes.items():
        service, metric = key.split("__")
        base[service] = {**base[service], metric: value}
    return base


def _result(*reaped: dict, held=()) -> dict:
    before = _sample()
    return {"warmup": {"held": []},
            "services": {name: {"before": row} for name, row in before.items()},
            "rounds": [{"reaped": r, "held": list(held)} for r in reaped]}


def test_bounds_catch_growth_and_only_growth():
    cfg = HygieneConfig(rss_round_kib=256, heap_round_kib=128, blocks_round=2500)
    assert violations(_result(_sample(), _sample()), cfg) == []
    # high-water in round 1 and a settling heap after it are allowed; growth in every round
    # after the first (a leak) is not
    rss = [80000, 90000, 92000, 92100, 92150]
    settling = [_sample(transceiver__rss_trimmed_kib=v, relay__rss_kib=v) for v in rss]
    assert violations(_result(*settling), cfg) == []
    leaking = [_sample(transceiver__rss_trimmed_kib=v + 300 * i, relay__rss_kib=v + 300 * i,
                       agent__py_blocks=1000 + 3000 * i, signaling__heap_kib=9000 + 200 * i)
               for i, v in enumerate(rss)]
    assert violations(_result(*leaking), cfg) == [
        "relay rss_kib grew in every round after the first: 10300 / 2300 / 400 / 350 "
        "(bound 256 in one of them)",
        "transceiver rss_trimmed_kib grew in every round after the first: 10300 / 2300 / 400 / "
        "350 (bound 256 in one of them)",
        "signaling heap_kib grew in every round after the first: 200 / 200 / 200 / 200 "
        "(bound 128 in one of them)",
        "agent py_blocks grew in every round after the first: 3000 / 3000 / 3000 / 3000 "
        "(bound 2500 in one of them)"]
    # a trimmed service's RSS as malloc keeps it, and what malloc keeps, are not bounded: the
    # heap in use, flat, says there is no leak
    kept = [_sample(transceiver__rss_kib=80000 + 3000 * i,
                    transceiver__heap_free_kib=1000 + 3000 * i) for i in range(4)]
    assert violations(_result(*kept), cfg) == []
    # counts: exactly back to baseline; fewer is fine
    found = violations(_result(_sample(transceiver__fds=19, agent__tasks=3,
                                       transceiver__mux_hop_cache=1)), cfg)
    assert found == ["round 1: transceiver fds 18 -> 19 (+1) once reaped; bound: back to "
                     "baseline", "round 1: transceiver mux_hop_cache 0 -> 1 (+1) once reaped; "
                     "bound: back to baseline"]
    # one round: Python's blocks bounded from before to the end, when asked
    one = _result(_sample(agent__py_blocks=7000))
    one["services"]["agent"]["before"]["py_blocks"] = 1000
    assert violations(one, cfg) == []
    assert violations(one, HygieneConfig(blocks_total=5000)) == [
        "agent py_blocks 1000 -> 7000 (+6000) once reaped; bound: +5000"]
    held = violations(_result(_sample(), held=["relay flows_active 3"]), cfg)
    assert held == [f"round 1: still held {cfg.reap_timeout_s:g} s after the clients: "
                    "relay flows_active 3"]


def test_settled_takes_the_minimum_of_each_count():
    a, b = _sample(transceiver__fds=21), _sample(transceiver__tasks=15, signaling__tasks=3)
    s = settled([a, b])
    assert s["transceiver"]["fds"] == 18 and s["transceiver"]["tasks"] == 14
    assert s["signaling"]["tasks"] is None  # not known in every sample: not compared


@pytest.mark.netns
def test_quick_run_leaves_no_growth_and_reaps_every_half_way_session(tmp_path):
    """2 rounds of 40 complete sessions and 40 half-way ones (no ICE, no DTLS, vanished after
    connecting), the transceiver's setup timeout and consent checks shortened to a second or
    two; round 2 grows no service's heap in use by more than 56 KiB (a native leak of 1 KiB a
    session is 80)."""
    cfg = HygieneConfig.quick(workdir=tmp_path)
    result = run(cfg)
    report = "\n".join(lines(result))
    assert result["violations"] == [], report
    assert json.loads(json.dumps(result)) == result  # JSON-ready
    sessions = result["sessions"]
    assert sessions["complete"]["ok"] == cfg.complete, report
    for kind in HALFWAY_KINDS:
        assert sessions["halfway"][kind]["ok"] == sessions["halfway"][kind]["n"], report
    assert sum(sessions["halfway"][k]["n"] for k in HALFWAY_KINDS) == cfg.halfway
    # the gauges this relies on are exposed
    t, a = result["services"]["transceiver"]["before"], result["services"]["agent"]["before"]
    assert t["tasks"] and a["tasks"] and t["fds"] and a["fds"], report
    for name in ("transceiver", "agent", "signaling"):
        row = result["services"][name]["reaped"]
        assert row["heap_kib"] and row["py_blocks"] and row["rss_trimmed_kib"], report
    assert result["services"]["relay"]["before"]["flows_active"] == 0
    # each half-way kind was ended by the server, by the timeout meant for it
    closed = Counter(r["reason"] for r in map(json.loads,
                                              (tmp_path / "transceiver-demo.log").open())
                     if r.get("event") == "session_closed")
    half = sessions["halfway"]
    assert closed["setup timeout"] == half["no-ice"]["n"] + half["no-dtls"]["n"], closed
    assert closed["connection closed"] == half["vanished"]["n"], closed
    assert closed["deleted"] >= cfg.complete + cfg.warmup, closed  # + retired reconnections
