"""Conversations across an impaired link (docs/conversation.md, "Checks"): the edge (agent in
reply mode, Redis, cluster relay, transceiver on the native plane, front) in one namespace, the
caller in another, the userspace impairment engine on the caller's ingress (the downlink).

Each check compares a run with a change against the clean run, so the world's own delays
(the transceiver's tick, the jitter buffer) cancel out: 100 ms more downlink delay must move
the downlink share and the turn gap by 100 ms and leave the uplink alone; lost frames must
lower PESQ; a relay stopped as the caller cuts in must make the barge-in late by the stop.
"""
from __future__ import annotations

import asyncio
import os
import signal

import pandas as pd
import pytest

from analysis import conversation as analysis
from scenarios.conversationspec import ConversationSpec
from scenarios.edge import ClusterPlan, Edge, EdgePlan, FrontPlan, FrontRoute, Host
from services.client.config import ClientConfig, ConversationConfig
from services.client.session import CallSession
from topology.impairment.factory import make_backend
from topology.impairment.lab import pair_lab
from topology.impairment.model import BernoulliLoss, Impairment
from topology.netns import in_namespace
from tests.conftest import needs

pytestmark = pytest.mark.netns

SESSIONS, TURNS = 3, 2
SLEEP_S = 0.3


@pytest.fixture(scope="module")
@needs("netns")
def world(tmp_path_factory):
    """The edge in namespace a, the engine impairing b's ingress (clean to begin with)."""
    logs = tmp_path_factory.mktemp("edge")
    with pair_lab("veconv", subnet="10.98.0", subnet6="fd98::") as lab:
        host = Host("edge", lab.a.name)
        cluster = ClusterPlan("lab", 1, host, public=lab.addr_a, internal="127.0.0.1")
        front = FrontPlan("lab", host, lab.addr_a, (FrontRoute("lab", 0.0),))
        plan = EdgePlan("cluster-relay", (cluster,), (front,),
                        transceiver_args=("--media-path", "native"),
                        agent_args=ConversationSpec(hangover_ms=300).agent_args())
        engine = make_backend("userspace", seed=5)
        engine.apply(lab.b, lab.if_b, Impairment())
        engine.start()
        try:
            with Edge(plan, logs) as edge:
                yield lab, edge, engine, edge.signaling_url(front)
        finally:
            engine.stop()


def _call(world, impairment: Impairment = Impairment(), sleep_relay_s: float = 0.0,
          audio_dir=None) -> pd.DataFrame:
    """Three conversations of two lines (the second into the reply) with the downlink
    ``impairment``; with ``sleep_relay_s``, the relay is stopped that long as the first caller
    cuts in."""
    lab, edge, engine, url = world
    engine.change(lab.b, lab.if_b, impairment)
    relay = edge.processes("relay-lab")
    config = ClientConfig(url=url, duration_s=30, start_rate=20,
                          conversation=ConversationConfig(turns=TURNS, barge_in_share=1.0),
                          audio_dir=None if audio_dir is None else str(audio_dir))

    async def sleeper(session: CallSession) -> None:
        while True:   # the first line spoken into a reply: stop the relay as it leaves
            talk = session.conversation
            turn = talk.current if talk is not None else None
            if turn is not None and turn.barge_in and turn.speech_start_unix is not None:
                break
            await asyncio.sleep(0.002)
        for pid in relay:
            os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(sleep_relay_s)
        finally:
            for pid in relay:
                os.kill(pid, signal.SIGCONT)

    async def calls():
        sessions = [CallSession(config, i) for i in range(SESSIONS)]
        waker = asyncio.create_task(sleeper(sessions[0])) if sleep_relay_s else None
        try:
            return await asyncio.gather(*(s.run() for s in sessions))
        finally:
            if waker is not None:
                waker.cancel()
                await asyncio.gather(waker, return_exceptions=True)

    try:
        results = in_namespace(lab.b.name, asyncio.run, calls())
    finally:
        engine.change(lab.b, lab.if_b, Impairment())
    assert all(r.ok for r in results), [r.error for r in results]
    rows = [{"architecture": "lab", "client_region": "b", "session": r.index, **t}
            for r in results for t in r.turns]
    return analysis.derive(pd.DataFrame(rows))


@pytest.fixture(scope="module")
def clean(world, tmp_path_factory):
    audio = tmp_path_factory.mktemp("clean")
    return _call(world, audio_dir=audio), audio


def test_100_ms_more_on_the_downlink_moves_the_downlink_share_and_the_gap_by_100_ms(world,
                                                                                     clean):
    base, _ = clean
    slow = _call(world, Impairment(delay_ms=100))
    for frame in (base, slow):
        answered = frame[frame.gap_ms.notna()]
        assert len(answered) == SESSIONS * TURNS and answered.split_error_ms.abs().max() < 5
    down = slow.downlink_ms.median() - base.downlink_ms.median()
    gap = slow.gap_ms.median() - base.gap_ms.median()
    up = slow.uplink_ms.median() - base.uplink_ms.median()
    heard = ((slow.gap_ms - slow.uplink_ms - slow.agent_ms).median()
             - (base.gap_ms - base.uplink_ms - base.agent_ms).median())
    assert 92 <= down <= 108, (down, base.downlink_ms.tolist(), slow.downlink_ms.tolist())
    assert 92 <= heard <= 108, heard     # the caller hears the reply that much later
    # The whole gap moves with it, give or take what differs between two runs anyway: the
    # uplink waits 0-20 ms for the transceiver's next tick (the phase of each call's packets
    # against it) and the agent's hangover, counted in frames as the ticks hand them over, is
    # one frame off in some turns.
    assert 75 <= gap <= 125, gap
    assert abs(up) <= 20, up


def test_a_loss_burst_on_the_downlink_lowers_pesq(world, clean, tmp_path):
    base, base_audio = clean
    lossy_audio = tmp_path / "lossy"
    lossy = _call(world, Impairment(loss=BernoulliLoss(10)), audio_dir=lossy_audio)

    def scores(frame, audio_dir):
        frame = frame.copy()
        frame["audio"] = [None if not isinstance(a, str) else str(audio_dir / a)
                          for a in frame.audio]
        d = audio_dir.parent / f"scored-{audio_dir.name}"
        d.mkdir()
        frame.to_csv(d / analysis.TURNS_FILE, index=False)
        assert analysis.score(d) >= 2
        return pd.read_csv(d / analysis.TURNS_FILE).pesq.dropna()

    clean_pesq, lossy_pesq = scores(base, base_audio), scores(lossy, lossy_audio)
    assert clean_pesq.median() > 3.8, clean_pesq.tolist()
    assert lossy_pesq.median() < clean_pesq.median() - 0.5, (clean_pesq.tolist(),
                                                             lossy_pesq.tolist())


def test_a_barge_in_through_a_sleeping_relay_is_late_by_the_sleep(world, clean):
    base, _ = clean
    slept = _call(world, sleep_relay_s=SLEEP_S)
    cut = slept[(slept.session == 0) & slept.barge_in].barge_reaction_ms
    usual = base[base.barge_in].barge_reaction_ms
    assert len(cut) == 1 and len(usual) == SESSIONS
    late = float(cut.iloc[0]) - usual.median()
    detected = (slept[(slept.session == 0) & slept.barge_in].barge_detect_ms.iloc[0]
                - base[base.barge_in].barge_detect_ms.median())
    # Late by the sleep, less a little: when the relay wakes, the frames it held reach the
    # agent at once, so the VAD's onset (its second voiced frame, 20 ms after the first) and the
    # wait for the transceiver's next tick cost nothing (measured: detection 264 ms late,
    # the reply's end at the ear 245 ms, for a 300 ms sleep).
    assert SLEEP_S * 1000 - 70 <= detected <= SLEEP_S * 1000 + 30, detected
    assert SLEEP_S * 1000 - 90 <= late <= SLEEP_S * 1000 + 50, (late, usual.tolist())

