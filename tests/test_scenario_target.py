"""``voiceedge scenario FILE --target URL``: a scenario's clients against a deployed edge.

The "deployment" is the demo's one-cluster edge (Redis, relay, transceiver, echo agent,
signaling) as real processes in a lab network namespace, once through the cluster relay and
once with a port per session; ``voiceedge scenario --target`` runs in that namespace as a user
would run it on a host that reaches the deployment. Needs root (the namespace).
"""
from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from scenarios.demo_edge import demo_plan
from scenarios.edge import Edge
from scenarios.target import Target
from tests.conftest import REPO, lab_fixture

pytestmark = pytest.mark.shareable  # make test runs it beside another (pyproject)

lab = lab_fixture("vetarget")
SESSIONS = 4
SCENARIO = f"""\
name: target-test
description: A few short calls against a deployment.
clusters: [na-east]
sessions_per_region: {SESSIONS}
call_duration_s: 4
start_rate: 4
architectures: [port-per-session, cluster-relay, global-relay]
"""


def scenario_cmd(lab, *args: str) -> list[str]:
    return ["ip", "netns", "exec", lab.name, sys.executable, "-m", "voiceedge", "scenario",
            *args]


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("target-scenario") / "target-test.yaml"
    path.write_text(SCENARIO)
    return path


def run_against(lab, mode: str, scenario_file, tmp_path_factory):
    """(summary, results folder) of a --target run against the demo edge in ``mode``."""
    # the shared edge's front checks API keys: the run trades the key for a token
    plan = replace(demo_plan(mode, lab.name, *lab.addresses), api_keys=mode == "shared")
    out = tmp_path_factory.mktemp(f"target-{mode}")
    with Edge(plan, tmp_path_factory.mktemp(f"target-edge-{mode}")) as edge:
        url = edge.signaling_url(plan.fronts[0])  # http://127.0.0.1:PORT/v1/calls: accepted
        key = (("--api-key-file", str(edge.credentials.key_file))
               if edge.credentials is not None else ())
        proc = subprocess.run(scenario_cmd(lab, str(scenario_file), "--target", url,
                                           "--results", str(out), "--json", *key),
                              capture_output=True, text=True, cwd=REPO, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [directory] = list(out.iterdir())
    return json.loads(proc.stdout), directory, url


@pytest.fixture(scope="module")
def shared_run(lab, scenario_file, tmp_path_factory):
    return run_against(lab, "shared", scenario_file, tmp_path_factory)


@pytest.fixture(scope="module")
def per_session_run(lab, scenario_file, tmp_path_factory):
    return run_against(lab, "per-session", scenario_file, tmp_path_factory)


def sessions(directory) -> list[dict]:
    with open(directory / "sessions.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_target_run_measures_every_session_and_marks_the_folder(shared_run):
    summary, directory, url = shared_run
    assert directory.name.startswith("target-test-target-")
    arch = summary["architectures"]["deployment"]
    assert (arch["sessions"], arch["ok"]) == (SESSIONS, SESSIONS)
    assert summary["exit_status"] == 0
    for metric in ("setup_ms", "first_ice_rtt_ms", "rtt_ms", "jitter_ms"):
        assert arch[metric]["n"] == SESSIONS and arch[metric]["p50"] is not None, metric
    rows = sessions(directory)
    assert {r["architecture"] for r in rows} == {"deployment"}
    assert {r["client_region"] for r in rows} == {"target"}
    assert all(r["echo_verified"] == "True" and r["datachannel_verified"] == "True"
               for r in rows)
    # what the clients were asked to verify (the project's edge: all three) and did
    assert all(r["verifies"] == r["verified"] == "audio,datachannel,envelope"
               and r["datachannel_echo"] == "envelope" for r in rows)
    assert all(r["floor_setup_ms"] == "" for r in rows)  # no configured topology, no floor
    config = json.loads((directory / "config.json").read_text())
    assert config["target"]["url"] == url.removesuffix("/v1/calls")
    assert config["mode"] == "deployment target" and config["architectures"] == ["deployment"]
    assert not (directory / "calibration.json").exists()
    assert summary["complete"] is True  # no calibration is not something missing here
    # the front checked keys: the clients carried the token the run got for the key, and
    # neither is in the results
    for path in directory.rglob("*"):
        if path.is_file() and path.suffix not in (".png",):
            assert b"vek_" not in path.read_bytes() and b"vet_" not in path.read_bytes(), path


def test_target_report_says_what_it_measured(shared_run):
    summary, directory, url = shared_run
    md = (directory / "report.md").read_text()
    base = url.removesuffix("/v1/calls")
    assert md.startswith(f"# target-test: deployment target {base}")
    assert "no emulated world" in md and "## Calibration" not in md
    assert "## What the clients verified" in md
    assert f"| deployment | audio,datachannel,envelope | {SESSIONS}/{SESSIONS} |" in md
    html = (directory / "report.html").read_text()
    assert "deployment target" in html and "id='calibration'" not in html
    assert "calibration <b>FAILED" not in html and "emulated world was not proven" not in html
    # `voiceedge report` on the folder later gives the same marking
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "report", str(directory),
                           "--json"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "deployment" in json.loads(proc.stdout)["summary"]["architectures"]


def test_server_media_addresses_are_measured_from_the_clients(shared_run, per_session_run):
    """One address for every session through the relay, one per session without it: what the
    clients' selected pairs reached, not what the plan says."""
    shared = shared_run[0]["architectures"]["deployment"]
    per_session = per_session_run[0]["architectures"]["deployment"]
    assert shared["public_udp_ports"] == 1
    assert per_session["public_udp_ports"] == SESSIONS
    assert 1 <= shared["peak_sessions"] <= SESSIONS


def test_ctrl_c_stops_the_clients_and_keeps_the_sessions_that_ended(lab, tmp_path_factory):
    """Ctrl-C once a session has ended: exit 130, no client left, and the folder holds that
    session, readable by `voiceedge report`."""
    path = tmp_path_factory.mktemp("target-ctrlc") / "long.yaml"
    path.write_text(SCENARIO.replace(f"sessions_per_region: {SESSIONS}",
                                     "sessions_per_region: 20").replace("start_rate: 4",
                                                                        "start_rate: 2"))
    out = tmp_path_factory.mktemp("target-ctrlc-results")
    plan = demo_plan("shared", lab.name, *lab.addresses)
    with Edge(plan, tmp_path_factory.mktemp("target-edge-ctrlc")) as edge:
        proc = subprocess.Popen(scenario_cmd(lab, str(path), "--target",
                                             edge.signaling_url(plan.fronts[0]),
                                             "--results", str(out)),
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        deadline = time.monotonic() + 60
        results = None
        while time.monotonic() < deadline:
            found = list(out.glob("*/logs/deployment/sessions-target.jsonl"))
            if found and found[0].read_text().strip():
                results = found[0]
                break
            time.sleep(0.2)
        assert results is not None, "no session ended"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    [directory] = list(out.iterdir())
    rows = sessions(directory)
    assert 1 <= len(rows) < 20
    left = subprocess.run(["pgrep", "-f", "--", f"--results {results}"], capture_output=True)
    assert left.returncode == 1, left.stdout  # no client left behind
    report = subprocess.run([sys.executable, "-m", "voiceedge", "report", str(directory)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]


@pytest.mark.parametrize("args, message", [
    (("--target", "ftp://127.0.0.1:8080"), "expected http[s]://HOST[:PORT]"),
    (("--target", "http://127.0.0.1:8080/?x=1"), "no query or fragment"),
    (("--target", "http://127.0.0.1:1"), "the target did not answer"),
    (("--target", "http://127.0.0.1:8080", "--region", "eu"), "--region is about the emulated"),
    (("--target", "http://127.0.0.1:8080", "--capture"), "--capture is about the emulated"),
    (("--target", "http://127.0.0.1:8080", "--verify", "audio,video"),
     "--verify: unknown check(s) video"),
])
def test_bad_target_input_is_one_line_and_runs_nothing(lab, scenario_file, tmp_path, args,
                                                       message):
    proc = subprocess.run(scenario_cmd(lab, str(scenario_file), "--results", str(tmp_path),
                                       *args), capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_wrong_api_key_gets_no_token_and_runs_nothing(lab, scenario_file, tmp_path):
    plan = replace(demo_plan("shared", lab.name, *lab.addresses), api_keys=True)
    wrong = tmp_path / "key"
    wrong.write_text("vek_testbed_" + "A" * 43 + "\n")
    results = tmp_path / "results"
    results.mkdir()
    (tmp_path / "edge").mkdir()
    with Edge(plan, tmp_path / "edge") as edge:
        proc = subprocess.run(scenario_cmd(lab, str(scenario_file), "--target",
                                           edge.signaling_url(plan.fronts[0]), "--results",
                                           str(results), "--api-key-file", str(wrong)),
                              capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "gave no call token for --api-key-file's key: HTTP 401 unknown credential" \
        in proc.stderr and "Traceback" not in proc.stderr and "AAAA" not in proc.stderr
    assert list(results.iterdir()) == []
    alone = subprocess.run(scenario_cmd(lab, str(scenario_file), "--api-key-file", str(wrong)),
                           capture_output=True, text=True, cwd=REPO, timeout=60)
    assert alone.returncode == 2 and "--api-key-file is for --target" in alone.stderr


def test_a_scenario_with_faults_is_refused(lab, tmp_path):
    proc = subprocess.run(scenario_cmd(lab, str(REPO / "scenarios" / "ci-faults.yaml"),
                                       "--target", "http://127.0.0.1:1", "--results",
                                       str(tmp_path)), capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "faults" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("text, url", [
    ("http://10.0.0.1:8080", "http://10.0.0.1:8080"),
    ("http://10.0.0.1:8080/", "http://10.0.0.1:8080"),
    ("https://edge.example/voice/v1/calls", "https://edge.example/voice"),
    ("http://[2001:db8::1]:8080/call", "http://[2001:db8::1]:8080"),
])
def test_target_url_forms(text, url):
    target = Target.parse(text)
    assert target.url == url
    assert target.calls_url == f"{url}/v1/calls" and target.page_url == f"{url}/call"


@pytest.mark.parametrize("text", ["10.0.0.1:8080", "http://", "http://h:99999", "ws://h:1"])
def test_bad_target_urls(text):
    with pytest.raises(ValueError):
        Target.parse(text)
