"""The client's reconnection through the real edge: a transceiver killed under a live call.

One cluster with two transceivers behind its relay and signaling (real processes in a lab
network namespace, as in tests/test_edge.py), real aiortc clients. Killing the transceiver
that serves a call (SIGKILL: no DTLS close, no BYE) leaves the client's ICE and DTLS
"connected" (aioice's consent checks would take about 30 s to give up): only the media
watchdog notices, and the client calls again, through the same front, onto the other
transceiver. Needs root.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from dataclasses import replace

import pytest

from scenarios.demo_edge import demo_plan
from scenarios.edge import Edge
from services.client.config import ClientConfig
from services.client.session import CallSession, run_session
from tests.conftest import lab_fixture, until
from topology.netns import in_namespace

pytestmark = pytest.mark.shareable  # make test runs it beside another (pyproject)

lab = lab_fixture("vereconn")


@pytest.fixture(scope="module")
def edge(lab, tmp_path_factory):
    """The demo's one-cluster edge, with two transceivers."""
    plan = demo_plan("shared", lab.name, *lab.addresses)
    plan = replace(plan, clusters=(replace(plan.clusters[0], transceivers=2),))
    with Edge(plan, tmp_path_factory.mktemp("reconnect-edge")) as running:
        yield running


def transceivers(edge: Edge) -> dict[str, str]:
    """The transceiver's number in its cluster (what answers name in X-Voiceedge-Transceiver)
    -> service name."""
    cluster = edge.plan.clusters[0]
    return {str(tid): cluster.transceiver_name(tid) for tid in cluster.transceiver_ids}


def healthz(edge: Edge) -> dict:
    front = edge.plan.fronts[0]
    url = f"http://{front.listen}:{edge.plan.ports.signaling}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:  # 503: none healthy, same body
        return json.loads(exc.read())


def revive(edge: Edge) -> None:
    """Every transceiver running, and the front has seen each answer its probe (earlier tests
    may have killed some)."""
    for name in transceivers(edge).values():
        if not edge.services[name].process.alive():
            edge.start_service(name)
    deadline = time.monotonic() + 10
    while not all(t["healthy"] for t in in_namespace(edge.plan.fronts[0].host.netns, healthz,
                                                     edge)["transceivers"]):  # an open front
        assert time.monotonic() < deadline, "the front never saw both transceivers up"
        time.sleep(0.1)


def config(edge: Edge, **kw) -> ClientConfig:
    return ClientConfig(url=edge.signaling_url(edge.plan.fronts[0]),
                        **{"setup_timeout_s": 5.0, **kw})


async def call_and_kill(edge: Edge, cfg: ClientConfig, kill_all: bool, after_s: float = 1.0):
    """Start a call; ``after_s`` into it, SIGKILL the transceiver serving it (or all of them).
    Returns (result, the serving transceiver's number, wall clock of the kill)."""
    session = CallSession(cfg)
    task = asyncio.create_task(session.run())
    try:
        await until(lambda: session.result.setup_ms is not None or task.done(), 10)
        assert not task.done(), session.result.error
        await asyncio.sleep(after_s)
        serving = session.result.transceiver
        names = transceivers(edge)
        killed_at = time.time()
        for url, name in names.items():
            if kill_all or url == serving:
                edge.kill(name)
        return await task, serving, killed_at
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def test_a_plain_call_through_two_transceivers_does_not_reconnect(lab, edge):
    revive(edge)
    r = in_namespace(lab.name, asyncio.run, run_session(config(edge, duration_s=2.0)))
    assert r.ok, r.error
    assert r.reconnections == 0 and len(r.attempts) == 1
    assert r.cluster == "demo" and r.transceiver in transceivers(edge)
    assert (r.attempts[0]["cluster"], r.attempts[0]["transceiver"]) == (r.cluster, r.transceiver)
    assert r.first_rx_unix is not None and r.last_rx_unix > r.first_rx_unix


def test_a_killed_transceiver_call_moves_to_the_other_one(lab, edge):
    revive(edge)
    cfg = config(edge, duration_s=5.0)
    r, serving, killed_at = in_namespace(lab.name, asyncio.run,
                                         call_and_kill(edge, cfg, kill_all=False))
    print(f"killed {serving}: {r.attempts}, gaps {r.rx_gaps}")
    assert r.ok, (r.error, r.attempts)
    assert r.reconnections == 1 and len(r.attempts) == 2, r.attempts
    first, second = r.attempts
    assert first["transceiver"] == serving == r.transceiver
    assert first["error"] == "media timeout"   # ICE and DTLS never noticed on their own
    assert second["reason"] == "media timeout" and second["error"] is None
    assert second["transceiver"] in transceivers(edge) and second["transceiver"] != serving
    assert second["cluster"] == "demo"
    # The down gap across the reconnection: from the last packet before the kill to the first
    # one from the other transceiver.
    across = [g for g in r.rx_gaps if g[2] == 1]
    assert len(across) == 1, r.rx_gaps
    start, ms, _ = across[0]
    assert ms >= cfg.media_timeout_s * 1000
    assert killed_at - 0.5 < start < killed_at + 0.1
    # Audio resumed on the new connection, the data channel of each attempt echoed its event.
    assert second["connected_unix"] < start + ms / 1000 < r.last_rx_unix
    assert r.last_rx_unix - (start + ms / 1000) > 1.0
    assert r.events.count("agent.echo") == 2, r.events
    assert r.echo_verified and r.datachannel_verified
    # The call kept its end: first connected + duration_s.
    assert r.call_ms == pytest.approx(cfg.duration_s * 1000, abs=500)


def test_a_call_whose_transceivers_all_died_is_lost_after_bounded_attempts(lab, edge):
    revive(edge)
    cfg = config(edge, duration_s=10.0)
    t0 = time.monotonic()
    r, _, killed_at = in_namespace(lab.name, asyncio.run, call_and_kill(edge, cfg, kill_all=True))
    elapsed = time.monotonic() - t0
    print(f"all killed: {r.error}; {r.attempts}")
    assert not r.ok and r.stage == "call"
    assert r.error.startswith(f"lost after {cfg.reconnect_attempts} reconnection attempts: "), \
        r.error
    assert r.reconnections == cfg.reconnect_attempts
    assert len(r.attempts) == cfg.reconnect_attempts + 1
    assert r.attempts[0]["error"] == "media timeout"
    for before, attempt in zip(r.attempts, r.attempts[1:]):
        assert attempt["reason"] == before["error"]       # why it called again
        assert attempt["error"] and attempt["connected_unix"] is None
    assert r.error.endswith(r.attempts[-1]["error"])
    # the backoff between the attempts: 0, 0.5, 1.0 s (plus each attempt's own time)
    starts = [a["started_unix"] for a in r.attempts[1:]]
    waits = [b - a for a, b in zip(starts, starts[1:])]
    assert waits[0] >= 0.5 and waits[1] >= 1.0, waits
    assert starts[0] - killed_at < cfg.media_timeout_s + 1.0
    assert elapsed < cfg.duration_s, "lost before the call's end, not at it"
