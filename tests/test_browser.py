"""Headless Chromium as a client: ``voiceedge browser`` through the real edge.

The demo's one-cluster edge (Redis, the cluster relay whose public address is the answers'
only candidate, a transceiver, the echo agent, signaling) as real processes in a lab network
namespace, and ``voiceedge browser`` started inside that namespace the way the scenario runner
starts it in a client host: a child process, Debian's chromium driven by Playwright. Needs root
and chromium (``make test`` installs it: ``make browsers``).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from services.procfs import processes
from tests.browser_edge import (calls_created, chromium, edge, get,  # noqa: F401 (fixtures)
                                signaling_url, wait_for_sessions)
from tests.conftest import REPO, lab_fixture

lab = lab_fixture("vebrowser")
TONE_ECHO_RMS = 0.1  # the tone's echo measures ~0.3 here (docs/browser.md, "Echo"); silence 0


def browser_cmd(lab, *args: str) -> list[str]:
    return ["ip", "netns", "exec", lab.name, sys.executable, "-m", "voiceedge", "browser", *args]


def start_browser(lab, *args: str) -> subprocess.Popen:
    """``voiceedge browser`` in the lab namespace, in a session of its own (as the runner's
    ServiceProcess starts it): every process it leaves behind keeps that session id."""
    return subprocess.Popen(browser_cmd(lab, *args), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def leftovers(sid: int, wait_s: float = 10.0) -> list[int]:
    """Processes still in session ``sid`` after up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        left = [pid for pid, fields in processes() if int(fields[3]) == sid]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_the_front_serves_the_call_page_on_the_signaling_origin(lab, edge):
    origin = signaling_url(edge).removesuffix("/v1/calls")
    status, headers, body = get(lab, f"{origin}/call?offer=immediate")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert 'src="call.js"' in body
    assert headers.get("Connection") == "close"  # the offer's POST opens its own connection
    status, headers, body = get(lab, f"{origin}/call.js")
    assert status == 200 and "javascript" in headers["Content-Type"]
    assert "window.runSession" in body


def test_a_gathered_and_an_immediate_session_through_the_relay(lab, edge, chromium, tmp_path):
    results, samples = tmp_path / "sessions.jsonl", tmp_path / "samples.jsonl"
    proc = start_browser(lab, "--url", signaling_url(edge), "-n", "2", "--rate", "2",
                         "--duration", "3", "--offer", "alternate", "--index-base", "100",
                         "--results", str(results), "--samples", str(samples), "--json")
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err[-3000:]
    assert leftovers(proc.pid) == []

    summary = json.loads(out)
    assert summary["ok"] == 2 and set(summary["offer_styles"]) >= {"gathered", "immediate"}
    assert summary["browser"]["version"] and summary["browser"]["launch_ms"] > 0
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    by_style = {r["offer_style"]: r for r in lines}
    assert sorted(r["index"] for r in lines) == [100, 101] and set(by_style) == {
        "gathered", "immediate"}
    assert by_style["gathered"]["index"] == 100  # alternate starts gathered
    vip = edge.plan.advertise(edge.plan.clusters[0])

    for style, r in by_style.items():
        b = r["browser"]
        assert r["ok"] and r["stage"] == "done", (style, r["error"])
        assert (r["client_type"], r["client"]) == ("chromium", "full")
        assert r["echo_verified"] and r["echo_rms"] >= TONE_ECHO_RMS, (style, r["echo_rms"])
        assert r["datachannel_verified"] and "agent.echo" in r["events"]
        assert r["delete_status"] == 204 and r["teardown_error"] is None
        marks = b["marks"]
        assert (marks["offer"] < marks["answer"] < marks["ice_connected"]
                <= marks["dtls_connected"] <= marks["first_audio"]), (style, marks)
        assert marks["ice_checking"] <= marks["ice_connected"]
        assert r["offer_ms"] == marks["offer"] and r["setup_ms"] == marks["dtls_connected"]
        assert r["signaling_ms"] == pytest.approx(marks["answer"] - marks["offer"], abs=0.01)
        # the selected pair: its remote end is the advertised relay address
        assert r["ice_pair"].split(" -> ")[1] == vip, (style, r["ice_pair"])
        assert b["remote_candidate"] == "host" and b["local_candidate"] == "host"
        assert r["first_ice_rtt_ms"] > 0 and b["first_ice_rtt_responses"] >= 1
        assert r["consent_rtt_ms"] is not None and r["jitter_ms"] is not None
        assert r["packets_received"] >= 100 and r["loss_pct"] is not None
        assert r["call_ms"] >= 3000
        assert (r["started_unix"] < r["first_rx_unix"] <= r["last_rx_unix"] <= r["ended_unix"])
        assert r["attempts"][0]["connected_unix"] is not None

    assert by_style["gathered"]["browser"]["offer_candidates"] > 0
    assert by_style["gathered"]["gathered_ms"] <= by_style["gathered"]["offer_ms"]
    # immediate: no candidate in the offer; the transceiver learned the client from its checks
    assert by_style["immediate"]["browser"]["offer_candidates"] == 0
    assert by_style["immediate"]["gathered_ms"] is None

    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert {s["session"] for s in rows} == {100, 101}
    for index in (100, 101):
        mine = [s for s in rows if s["session"] == index]
        assert len(mine) >= 3 and [s["t_ms"] for s in mine] == sorted(s["t_ms"] for s in mine)
        assert mine[-1]["packets_received"] >= 100
    wait_for_sessions(lab, edge, 0)  # the DELETEs ended both calls


def test_silence_is_not_taken_for_the_echo(lab, edge, chromium, tmp_path):
    """A silent microphone: the call works, the echo check fails. (With the ICE servers from
    the front, which has no TURN here: none, policy all.)"""
    results = tmp_path / "sessions.jsonl"
    proc = start_browser(lab, "--url", signaling_url(edge), "--tone-hz", "0", "--offer",
                         "immediate", "--duration", "2", "--ice-from-signaling",
                         "--results", str(results), "-q")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    [r] = [json.loads(line) for line in results.read_text().splitlines()]
    assert r["ok"] and r["datachannel_verified"]
    assert not r["echo_verified"] and r["echo_rms"] < 0.001, r["echo_rms"]
    assert r["browser"]["ice_policy"] == "all"
    assert leftovers(proc.pid) == []


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_run_leaves_no_browser_behind(lab, edge, chromium, tmp_path, how):
    """Ctrl-C in a terminal (SIGINT to the whole process group) or SIGTERM to the command
    alone (which then closes the browser itself): nothing of it stays. (Its call is not
    DELETEd: the transceiver ends it when its consent checks go unanswered.)"""
    before = calls_created(lab, edge)
    proc = start_browser(lab, "--url", signaling_url(edge), "--duration", "30", "-q")
    try:
        deadline = time.monotonic() + 30
        while calls_created(lab, edge) == before:  # until its call is up
            assert time.monotonic() < deadline and proc.poll() is None, "no call was made"
            time.sleep(0.1)
        time.sleep(0.5)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == (130 if how == "ctrl-c" else 143), err[-3000:]
    assert ("voiceedge browser: interrupted" if how == "ctrl-c"
            else "voiceedge browser: stopped by SIGTERM") in err
    assert leftovers(proc.pid) == []


def test_bad_input_is_one_line(tmp_path):
    cases = {("--url", "ftp://x"): "--url 'ftp://x' is not an http(s) URL",
             ("--url", "http://x/v1/calls", "--rate", "0"): "--rate must be positive",
             ("--url", "http://x/v1/calls", "-n", "0"): "--sessions must be at least 1",
             ("--url", "http://x/v1/calls", "--chromium", str(tmp_path / "none")):
                 "run `make browsers`",
             ("--url", "http://x/v1/calls", "--audio-dir", str(tmp_path)):
                 "--audio-dir needs --conversation",
             ("--url", "http://x/v1/calls", "--conversation", "0"):
                 "--conversation: a conversation needs at least 1 turn",
             ("--url", "http://x/v1/calls", "--conversation", "2", "--barge-in-share", "2"):
                 "--conversation: barge_in_share must be between 0 and 1"}
    for args, expected in cases.items():
        proc = subprocess.run([sys.executable, "-m", "voiceedge", "browser", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stdout == ""
        [line] = proc.stderr.splitlines()
        assert expected in json.loads(line)["error"], line
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "browser", "--url", "http://x",
                           "--offer", "sideways"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "invalid choice: 'sideways'" in proc.stderr
