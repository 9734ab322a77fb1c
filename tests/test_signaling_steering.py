"""Steering by measurement: the policy with constructed probe sequences, then a real front.

The policy (services/signaling/steering.py) is pure: each test feeds it probe rounds and reads
its ranking. The front test runs two fake transceiver control APIs on loopback, one slow to
answer ``/status`` (a distant cluster), with configured RTTs that say the opposite.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.logs import Event
from services.signaling.server import ClusterRoute, SignalingConfig, SignalingServer
from services.signaling.steering import (DOWN, HYSTERESIS, OVER_LOAD, ClusterProbe, Decision,
                                         Steering, SteeringConfig)
from tests.conftest import REPO, free_port, until
from tests.offers import STATIC_OFFER
from tests.test_signaling_pool import SlowTransceiver

SDP = {"Content-Type": "application/sdp"}
CFG = SteeringConfig(load_threshold=0.9, switch_ms=10.0, switch_pct=20.0, switch_probes=3,
                     window=5)


def up(rtt: float | None, sessions: int = 0, capacity: int = 100) -> ClusterProbe:
    return ClusterProbe(rtt, True, sessions, capacity)


DOWN_PROBE = ClusterProbe(None, False)


def chosen(s: Steering) -> str:
    """The cluster a call would go to now (the first one not skipped)."""
    return next(c.cluster for c in s.rank() if c.skip is None)


def test_seeds_rank_until_measurements_exist_then_the_nearer_is_chosen():
    s = Steering({"a": 10.0, "b": 50.0}, CFG)
    assert s.preferred == "a" and [c.cluster for c in s.rank()] == ["a", "b"]
    assert not any(c.measured for c in s.rank())
    # the seeds say a, measurements say b (by far more than the margin): b after 3 rounds
    changes = [s.observe({"a": up(80.0), "b": up(20.0)}) for _ in range(3)]
    assert changes[:2] == [None, None] and s.preferred == "b"
    assert changes[2].from_cluster == "a" and changes[2].to_cluster == "b"
    assert "b measured 20.0 ms" in changes[2].why
    assert chosen(s) == "b" and all(c.measured for c in s.rank())


def test_a_nearer_cluster_over_the_load_threshold_or_down_sends_calls_to_the_other():
    s = Steering({"near": 5.0, "far": 80.0}, CFG)
    s.observe({"near": up(5.0, sessions=89), "far": up(80.0)})
    assert s.preferred == "near" and chosen(s) == "near"
    s.observe({"near": up(5.0, sessions=90), "far": up(80.0)})  # 90% of 100: at the threshold
    ranking = s.rank()
    assert ranking[0].skip == OVER_LOAD and chosen(s) == "far"
    assert s.preferred == "near"  # load is decided per call, not by the preferred cluster
    # fresher load from the front's own counters wins over the last probe's
    assert [c.skip for c in s.rank({"near": (10, 100)})] == [None, None]
    change = s.observe({"near": DOWN_PROBE, "far": up(80.0)})
    assert (change.from_cluster, change.to_cluster, change.why) == ("near", "far", "near down")
    assert [(c.cluster, c.skip) for c in s.rank()] == [("far", None), ("near", DOWN)]


def test_back_to_the_nearer_cluster_only_after_the_hysteresis():
    s = Steering({"near": 5.0, "far": 80.0}, CFG)
    s.observe({"near": up(5.0), "far": up(80.0)})
    s.observe({"near": DOWN_PROBE, "far": up(80.0)})
    assert s.preferred == "far"
    for _ in range(2):  # near is back and nearer, but not for 3 rounds yet
        assert s.observe({"near": up(5.0), "far": up(80.0)}) is None
        assert s.preferred == "far" and chosen(s) == "far"
        assert s.rank()[1].cluster == "near" and s.rank()[1].skip is None
    change = s.observe({"near": up(5.0), "far": up(80.0)})
    assert change.to_cluster == "near" and chosen(s) == "near"


def test_a_single_noisy_probe_does_not_flip_the_choice():
    s = Steering({"a": 30.0, "b": 40.0}, CFG)
    for _ in range(5):
        s.observe({"a": up(30.0), "b": up(40.0)})
    # one spike on a: the median of the window hardly moves, b is not 10 ms / 20% better
    assert s.observe({"a": up(900.0), "b": up(40.0)}) is None
    assert s.rtt_ms("a") == 30.0 and s.preferred == "a"
    # b better by the margin for 2 rounds, then not: the streak starts over
    s2 = Steering({"a": 30.0, "b": 40.0}, SteeringConfig(window=1))
    s2.observe({"a": up(30.0), "b": up(40.0)})
    for rtt in (100.0, 100.0, 30.0, 100.0, 100.0):
        assert s2.observe({"a": up(rtt), "b": up(40.0)}) is None
    assert s2.preferred == "a"
    assert s2.observe({"a": up(100.0), "b": up(40.0)}).to_cluster == "b"


def test_a_difference_within_the_margin_never_switches():
    s = Steering({"a": 100.0, "b": 100.0}, CFG)
    for _ in range(10):  # b is 15 ms nearer: over 10 ms but not over 20% of 100 ms
        assert s.observe({"a": up(100.0), "b": up(85.0)}) is None
    assert s.preferred == "a"


def test_the_decision_says_why_each_nearer_cluster_was_not_chosen():
    s = Steering({"x": 5.0, "y": 20.0, "z": 90.0}, CFG)
    s.observe({"x": DOWN_PROBE, "y": up(20.0, sessions=95), "z": up(90.0)})
    ranking = s.rank()
    d = Decision.of("apac-se", s.preferred, ranking, {}, "z", "http://t")
    assert (d.cluster, d.nearest, d.preferred) == ("z", False, "y")
    assert d.reason == "x down; y over_load_threshold"
    assert [(c["cluster"], c["outcome"]) for c in d.candidates] == [
        ("y", OVER_LOAD), ("x", DOWN), ("z", "chosen")]
    # a nearer cluster that is up but not preferred yet: hysteresis
    s = Steering({"a": 50.0, "b": 90.0}, SteeringConfig(window=1))
    s.observe({"a": up(50.0), "b": up(90.0)})
    s.observe({"a": up(50.0), "b": up(10.0)})  # nearer for one round of the three needed
    d = Decision.of("r", s.preferred, s.rank(), {}, "a", "http://t")
    assert d.reason == f"b {HYSTERESIS}" and not d.nearest
    d = Decision.of("r", s.preferred, s.rank(), {"a": "full", "b": "unreachable"}, None, None)
    assert d.cluster is None and d.reason == "b unreachable; a full"
    # a farther cluster's state is not a reason: it was not needed
    s = Steering({"a": 5.0, "b": 90.0}, CFG)
    s.observe({"a": up(5.0), "b": DOWN_PROBE})
    d = Decision.of("r", s.preferred, s.rank(), {}, "a", "http://t")
    assert d.reason == "nearest" and [c["outcome"] for c in d.candidates] == ["chosen",
                                                                             "not_tried"]


def test_bad_steering_config_is_refused():
    for bad in ({"load_threshold": 0.0}, {"load_threshold": 1.5}, {"switch_ms": -1},
                {"switch_probes": 0}, {"window": 0}):
        with pytest.raises(ValueError):
            SteeringConfig(**bad)


def test_bad_steering_flags_are_one_line_errors():
    for flag, value in (("--steer-load-threshold", "1.5"), ("--steer-switch-probes", "0"),
                        ("--steer-switch-ms", "-3")):
        proc = subprocess.run([sys.executable, "-m", "voiceedge", "signaling", "--transceiver",
                               "http://127.0.0.1:1", flag, value], capture_output=True,
                              text=True, cwd=REPO, timeout=60)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        assert flag in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------ through a real front


def metrics(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_front_steers_by_measured_rtt_against_the_configured_one(caplog):
    """'near' is configured at 5 ms but answers its probes 150 ms late; 'far' is configured at
    200 ms and answers at once. The calls go to 'far', and the log says why."""
    caplog.set_level(logging.INFO, logger="voiceedge.signaling")
    slow_port, fast_port = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
    near = ClusterRoute("near", (f"http://127.0.0.1:{slow_port}",), rtt_ms=5.0)
    far = ClusterRoute("far", (f"http://127.0.0.1:{fast_port}",), rtt_ms=200.0)
    config = SignalingConfig(clusters=(near, far), listen=("127.0.0.1", 0), poll_interval=0.05,
                             warm_connections=1, region="test-region")

    async def main():
        slow = await SlowTransceiver(slow_port, call_delay=0.0, status_delay=0.15).start()
        fast = await SlowTransceiver(fast_port, call_delay=0.0, status_delay=0.0).start()
        try:
            async with SignalingServer(config) as front, aiohttp.ClientSession() as http:
                assert front.steering.preferred == "near"  # the seeds, before measurements
                await until(lambda: front.steering.preferred == "far", timeout=20.0)
                base = f"http://127.0.0.1:{front.port}"
                clusters = []
                for _ in range(3):
                    async with http.post(f"{base}/v1/calls", data=STATIC_OFFER,
                                         headers=SDP) as r:
                        assert r.status == 201, await r.text()
                        clusters.append(r.headers["X-Voiceedge-Cluster"])
                text = await (await http.get(f"{base}/metrics")).text()
                rtt = {c: front.steering.rtt_ms(c) for c in ("near", "far")}
                return clusters, text, rtt, len(slow.ports["sessions"])
        finally:
            await slow.stop()
            await fast.stop()

    clusters, text, rtt, slow_calls = asyncio.run(asyncio.wait_for(main(), 60))
    assert clusters == ["far"] * 3 and slow_calls == 0
    assert rtt["near"] > rtt["far"] + 100.0  # the probe delay, not the configured 5 ms
    m = metrics(text)
    assert m[("voiceedge_signaling_calls_steered_total",
              (("cluster", "far"), ("nearest", "true")))] == 3
    assert m[("voiceedge_signaling_steering_changes_total",
              (("from", "near"), ("to", "far")))] == 1
    assert m[("voiceedge_signaling_cluster_preferred", (("cluster", "far"),))] == 1
    records = [{"event": r.msg.name, **r.msg.fields} for r in caplog.records
               if isinstance(r.msg, Event)]
    changed = [r for r in records if r.get("event") == "steering_changed"]
    created = [r for r in records if r.get("event") == "call_created"]
    assert [(r["from"], r["to"]) for r in changed] == [("near", "far")]
    assert changed[0]["region"] == "test-region" and "far measured" in changed[0]["why"]
    assert len(created) == 3
    for r in created:
        assert (r["region"], r["cluster"], r["preferred"], r["reason"]) == (
            "test-region", "far", "far", "nearest")
        assert [(c["cluster"], c["outcome"], c["measured"]) for c in r["candidates"]] == [
            ("far", "chosen", True), ("near", "not_tried", True)]
        assert r["candidates"][1]["capacity"] == 1000 and r["candidates"][1]["load"] == 0.0
