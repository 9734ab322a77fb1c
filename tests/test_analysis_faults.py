"""analysis/faults.py: what each fault did, from small results folders written here in the
runner's format (faults.json, attempts.csv, gaps.csv, the sessions' wall-clock columns), where
the right answer is known by construction. No root, no network."""
from __future__ import annotations

import csv
import html
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from analysis import budgets_cli
from analysis.budgets import BudgetError, BudgetFile, FaultBudget, FaultBudgets, check_faults
from analysis.faults import FAULT_FIELDS, Target, fault_rows, read_faults_csv, transceiver_id
from analysis.load import ATTEMPT_COLUMNS, GAP_COLUMNS, SAMPLE_COLUMNS, SESSION_COLUMNS, \
    load_results
from analysis.report import write_report
from analysis.summary import finalize
from tests.conftest import REPO, write_architectures

T0 = 1_800_000_000.0  # the first session's start (wall clock)
GR, PPS = "global-relay", "port-per-session"
SESSION_TIMES = ("started_unix", "ended_unix", "connected_unix", "reconnections", "transceiver",
                 "first_rx_unix", "last_rx_unix", "renominated", "moved", "ice_restarts")
STEERING = ("architecture", "client_region", "front", "event", "call", "cluster", "nearest",
            "reason", "unix")


def url(n: int) -> str:
    """Transceiver n's control URL, as the runner records it."""
    return f"http://10.0.1.2:{8900 + n - 1}"


def session(n: int, started: float, ended: float, *, arch: str = GR, region: str = "apac-se",
            cluster: str = "na-east", ok: bool = True, transceiver: int = 1,
            reconnections: int = 0, rx: tuple[float, float] | None = None) -> dict:
    first_rx, last_rx = rx if rx is not None else (started + 1.0, ended - 0.1)
    return {"architecture": arch, "client_region": region, "cluster_region": cluster,
            "session": n, "ok": ok, "error": "" if ok else "media timeout",
            "stage": "done" if ok else "media", "signaling_ms": 200.0, "offer_ms": 4.0,
            "first_ice_rtt_ms": 240.0, "ice_connected_ms": 460.0, "setup_ms": 700.0,
            "first_audio_ms": 950.0, "rtt_ms": 240.0, "jitter_ms": 2.0, "loss_pct": 0.0,
            "packets_received": 200, "packets_lost": 0, "loss_bursts": "[]",
            "floor_signaling_rtt_ms": 190.0, "floor_media_rtt_ms": 235.0,
            "floor_setup_ms": 660.0, "started_unix": started, "ended_unix": ended,
            "connected_unix": started + 0.7, "reconnections": reconnections,
            "transceiver": url(transceiver), "first_rx_unix": first_rx, "last_rx_unix": last_rx}


def attempt(s: dict, n: int, started: float, connected: float | None, *,
            cluster: str | None = None, transceiver: int | None = 1, error: str = "") -> dict:
    return {"architecture": s["architecture"], "client_region": s["client_region"],
            "session": s["session"], "attempt": n,
            "reason": "first" if n == 0 else "media timeout", "started_unix": started,
            "connected_unix": "" if connected is None else connected,
            "cluster_region": cluster or "", "error": error,
            "transceiver": "" if transceiver is None else url(transceiver)}


def first_attempts(sessions: list[dict]) -> list[dict]:
    return [attempt(s, 0, s["started_unix"], s["connected_unix"], cluster=s["cluster_region"],
                    transceiver=transceiver_id(s["transceiver"])) for s in sessions]


def gap(s: dict, direction: str, start: float, ms: float, attempt_no: int = 0) -> dict:
    return {"architecture": s["architecture"], "client_region": s["client_region"],
            "session": s["session"], "direction": direction, "start_unix": start, "ms": ms,
            "attempt": attempt_no}


def fault(name: str, kind: str, target: str, *, arch: str = GR, at: float | None = None,
          end: float | None = None, ready: float | None = None, applicable: bool = True,
          note: str = "", redis: bool | None = None) -> dict:
    return {"fault": name, "kind": kind, "target": target, "architecture": arch,
            "applicable": applicable, "note": note, "planned_at_s": 0.0, "at_unix": at,
            "end_unix": end, "ready_unix": ready, "redis": redis, "detail": {}}


def _csv(path: Path, fields, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def write_folder(directory: Path, sessions: list[dict], *, attempts: list[dict] | None = None,
                 gaps=(), faults=(), samples=(), steering=(), archs=(GR,)) -> Path:
    """A results folder with the files a fault run writes (no calibration: not needed)."""
    directory.mkdir(parents=True)
    _csv(directory / "sessions.csv", SESSION_COLUMNS + SESSION_TIMES, sessions)
    _csv(directory / "attempts.csv", ATTEMPT_COLUMNS,
         first_attempts(sessions) if attempts is None else attempts)
    _csv(directory / "gaps.csv", GAP_COLUMNS, gaps)
    _csv(directory / "samples.csv", SAMPLE_COLUMNS, samples)
    if steering:
        _csv(directory / "steering.csv", STEERING, steering)
    (directory / "config.json").write_text(json.dumps({
        "scenario": {"name": "ci-faults", "architectures": list(archs)},
        "architectures": list(archs), "client_regions": ["apac-se"],
        "clusters": ["na-east", "eu-west"], "backend": "userspace", "baseline": PPS}))
    (directory / "faults.json").write_text(json.dumps({"faults": list(faults)}))
    write_architectures(directory, archs, PPS)
    return directory


def rows_by(directory: Path) -> dict[tuple[str, str], dict]:
    return {(r["fault"], r["architecture"]): r for r in fault_rows(load_results(directory))}


# ------------------------------------------------------------------ a relay kill

AT = T0 + 10.0  # the relay kill, 10 s after the first session started


def relay_kill_world(directory: Path) -> Path:
    """Six global-relay sessions from apac-se around a relay kill of cluster/na-east at AT (end
    +0.5 s, ready +0.9 s) and a cluster outage of na-east at AT + 10 s (it cuts the kill's
    window short)."""
    s0 = session(0, T0, T0 + 30)                                   # affected, 700 ms gap
    s1 = session(1, T0 + 1, T0 + 30, cluster="eu-west")            # another cluster
    s2 = session(2, T0 + 2, AT + 3, ok=False, rx=(T0 + 3, AT))     # affected and lost
    s3 = session(3, AT + 2, T0 + 40)                               # started after the fault
    s4 = session(4, T0 + 3, T0 + 9)                                # ended before it
    s5 = session(5, T0 + 4, T0 + 30)                               # two gaps, one before
    sessions = [s0, s1, s2, s3, s4, s5]
    gaps = [gap(s0, "down", AT + 0.1, 700.0),
            gap(s0, "down", AT + 10.2, 1500.0),   # the outage's, outside the kill's window
            gap(s1, "down", AT + 0.2, 2000.0),    # not on the killed relay's path
            gap(s5, "down", AT - 0.5, 300.0),     # ended before the fault
            gap(s5, "down", AT + 0.3, 200.0),
            gap(s5, "up", AT + 0.2, 150.0),
            gap(s0, "up", AT + 0.05, 90.0)]
    faults = [fault("f1", "relay_kill", "cluster/na-east", at=AT, end=AT + 0.5, ready=AT + 0.9,
                    redis=True),
              fault("f2", "cluster_outage", "cluster/na-east", at=AT + 10.0, end=AT + 14.0)]
    return write_folder(directory, sessions, gaps=gaps, faults=faults)


def test_a_relay_kill_gaps_recovery_and_who_it_hit(tmp_path):
    row = rows_by(relay_kill_world(tmp_path / "run"))[("f1", GR)]
    assert row["applicable"] is True and row["redis"] is True
    assert row["at_s"] == 10.0 and row["end_s"] == 0.5 and row["restart_s"] == 0.9
    assert row["window_s"] == 10.0  # ready + 10 s = +10.9, cut at the outage (+10 s)
    assert row["sessions_live"] == 4          # s0, s1, s2, s5
    assert row["sessions_affected"] == 3      # s1 is on eu-west
    assert row["sessions_lost"] == 1          # s2
    # longest down gap per affected session in the window: s0 700, s2 none (0), s5 200 (its
    # 300 ms gap ended before the fault); p95 of [0, 200, 700] = 200 + 0.9 x 500
    assert (row["gap_down_p50_ms"], row["gap_down_p95_ms"], row["gap_down_max_ms"]) == \
        (200.0, 650.0, 700.0)
    assert (row["gap_up_p50_ms"], row["gap_up_max_ms"]) == (90.0, 150.0)
    assert row["recovery_s"] == 0.8           # s0's audio back at +0.1 + 0.7
    assert row["gap_over_restart_ms"] == -200.0   # 700 - 900
    assert row["audio_after_ready_ms"] == -100.0  # back at +0.8, ready at +0.9
    assert row["new_calls"] == 1 and row["new_call_failures"] == 0  # s3 at +2 s
    assert row["reconnections"] == 0
    assert row["first_new_session_s"] is None and row["extra_rtt_ms"] is None


def test_the_next_fault_gets_what_came_after_it(tmp_path):
    row = rows_by(relay_kill_world(tmp_path / "run"))[("f2", GR)]
    # at AT + 10: s0, s1, s3, s5 live; s0, s3, s5 on na-east
    assert (row["sessions_live"], row["sessions_affected"], row["sessions_lost"]) == (4, 3, 0)
    assert row["gap_down_max_ms"] == 1500.0 and row["recovery_s"] == 1.7
    assert row["at_s"] == 20.0 and row["window_s"] == 14.0  # end +4 s, then 10 s
    assert row["restart_s"] is None and row["gap_over_restart_ms"] is None


# ------------------------------------------------------------------ a transceiver crash

def crash_world(directory: Path, target: str) -> Path:
    """Cluster na-east with two transceivers; transceiver 2 crashes at AT."""
    a = session(0, T0, T0 + 30, transceiver=1)
    b = session(1, T0 + 1, T0 + 30, transceiver=2, reconnections=1)
    c = session(2, T0 + 2, T0 + 30, transceiver=2, reconnections=1)  # moved to 1 before AT
    d = session(3, T0 + 3, T0 + 30, transceiver=2, ok=False, rx=(T0 + 4, AT))
    attempts = first_attempts([a, b, c, d]) + [
        attempt(c, 1, T0 + 5, T0 + 5.6, cluster="na-east", transceiver=1),
        # b calls again after the crash: a try that lands on the dead transceiver fails, the
        # next reaches transceiver 1
        attempt(b, 1, AT + 0.6, None, cluster="na-east", transceiver=2, error="502"),
        attempt(b, 2, AT + 1.0, AT + 1.3, cluster="na-east", transceiver=1)]
    gaps = [gap(b, "down", AT - 0.02, 1350.0, 2), gap(a, "down", AT + 0.1, 400.0)]
    faults = [fault("crash", "transceiver_crash", target, at=AT, end=AT + 2.0, ready=AT + 2.4)]
    return write_folder(directory, [a, b, c, d], attempts=attempts, gaps=gaps, faults=faults)


def test_a_transceiver_crash_hits_only_that_transceiver_s_sessions(tmp_path):
    row = rows_by(crash_world(tmp_path / "one", "cluster/na-east/2"))[("crash", GR)]
    assert row["sessions_live"] == 4
    assert row["sessions_affected"] == 2       # b and d; c had moved to transceiver 1
    assert row["sessions_lost"] == 1           # d
    assert row["gap_down_max_ms"] == 1350.0    # b; a's 400 ms gap is not the crash's
    assert row["recovery_s"] == 1.33           # b: -0.02 + 1.35
    assert row["reconnections"] == 2           # b's two tries
    assert row["new_calls"] == 2 and row["new_call_failures"] == 1
    assert row["first_new_session_s"] == 1.3   # b on transceiver 1, not the failed try on 2
    every = rows_by(crash_world(tmp_path / "all", "cluster/na-east"))[("crash", GR)]
    assert every["sessions_affected"] == 4     # no id: all of na-east
    assert every["first_new_session_s"] is None  # nothing connected off na-east
    assert "no call connected elsewhere" in every["note"]


# ------------------------------------------------------------------ a cluster outage

def test_a_cluster_outage_to_the_end_of_the_run(tmp_path):
    a = session(0, T0, T0 + 30, reconnections=1)
    b = session(1, T0 + 1, T0 + 30, cluster="eu-west")
    late = session(2, AT + 0.4, T0 + 30, cluster="eu-west")
    failed = session(3, AT + 0.2, AT + 5, ok=False, rx=(None, None))
    attempts = first_attempts([a, b]) + [
        # connected, then ended by a media timeout: placed, not a failure
        attempt(late, 0, AT + 0.4, AT + 1.1, cluster="eu-west", error="media timeout"),
        attempt(failed, 0, AT + 0.2, None, cluster=None, transceiver=None, error="503"),
        attempt(a, 1, AT + 1.2, AT + 1.9, cluster="eu-west")]
    gaps = [gap(a, "down", AT - 0.01, 2000.0, 1)]
    # media RTT: 240 ms on na-east before, 300 on eu-west after (samples t_ms from the start)
    samples = [{"architecture": GR, "client_region": "apac-se", "session": 0,
                "t_ms": 1000.0 * k, "packets_received": 50 * k, "packets_lost": 0,
                "jitter_ms": 2.0, "rtt_ms": 240.0 if k < 10 else 300.0}
               for k in range(2, 20) if not 10 <= k <= 12]
    out = fault("out", "cluster_outage", "cluster/na-east", at=AT, end=None)
    directory = write_folder(tmp_path / "run", [a, b, late, failed], attempts=attempts,
                             gaps=gaps, faults=[out], samples=samples)
    row = rows_by(directory)[("out", GR)]
    assert row["end_s"] is None and row["window_s"] == 30.0  # run ends at T0 + 30, then 10 s
    assert (row["sessions_live"], row["sessions_affected"], row["sessions_lost"]) == (2, 1, 0)
    assert row["recovery_s"] == 1.99
    # the first call connected off na-east: late's (started +0.4, connected +1.1), before a's
    # reconnection (+1.9)
    assert row["first_new_session_s"] == 1.1
    assert row["new_calls"] == 3 and row["new_call_failures"] == 1  # failed, late, a's retry
    assert row["reconnections"] == 1
    assert row["extra_rtt_ms"] == 60.0
    assert row["restart_s"] is None and row["audio_after_ready_ms"] is None


# ------------------------------------------------------------------ paths and rows

@pytest.mark.parametrize("target, arch, hit", [
    ("backbone/na-east/apac-se", GR, True),     # unordered pair
    ("backbone/apac-se/na-east", GR, True),
    ("backbone/apac-se/eu-west", GR, False),
    ("public/apac-se/na-east", GR, False),      # global-relay rides the backbone
    ("public/na-east/apac-se", PPS, True),
    ("backbone/apac-se/na-east", PPS, False),
    ("last_mile/apac-se", PPS, True),
    ("last_mile/na-east", GR, False),
    ("ingress/apac-se", GR, True),
    ("ingress/apac-se", PPS, False),
    ("cluster/na-east", PPS, True),
    ("cluster/na-east/1", GR, True),
    ("cluster/na-east/2", GR, False),
])
def test_which_targets_are_on_a_session_s_path(target, arch, hit):
    from analysis.archinfo import ArchInfo
    from scenarios import architectures
    info = ArchInfo.of(arch, architectures.get(arch).facts())   # as architectures.json has it
    assert Target.parse(target).on_path(info, "apac-se", "na-east", 1) is hit


def test_transceiver_ids_from_control_urls():
    assert transceiver_id("http://10.0.1.2:8900") == 1
    assert transceiver_id("http://10.0.1.2:8902/") == 3
    assert transceiver_id("2") == 2
    assert transceiver_id("") is None and transceiver_id(float("nan")) is None


def test_a_link_fault_hits_the_sessions_that_cross_it(tmp_path):
    on = session(0, T0, T0 + 30)
    other = session(1, T0, T0 + 30, region="au")
    faults = [fault("cut", "link_down", "backbone/na-east/apac-se", at=AT, end=AT + 1.0)]
    row = rows_by(write_folder(tmp_path / "run", [on, other], faults=faults))[("cut", GR)]
    assert (row["sessions_live"], row["sessions_affected"]) == (2, 1)
    assert row["recovery_s"] == 0.0  # no gap recorded: audio never stopped


def test_a_fault_that_does_not_apply_gets_a_row_that_says_so(tmp_path):
    s = session(0, T0, T0 + 30, arch=PPS)
    faults = [fault("f1", "relay_kill", "cluster/na-east", arch=PPS, applicable=False,
                    note="no relay in port-per-session")]
    row = rows_by(write_folder(tmp_path / "run", [s], faults=faults, archs=(PPS,)))[("f1", PPS)]
    assert row["applicable"] is False and row["note"] == "no relay in port-per-session"
    assert all(row[k] is None for k in ("at_s", "sessions_affected", "gap_down_max_ms",
                                        "recovery_s"))


def test_a_fault_that_never_happened_is_not_measured(tmp_path):
    s = session(0, T0, T0 + 30)
    faults = [fault("f1", "relay_kill", "cluster/na-east", at=None)]
    row = rows_by(write_folder(tmp_path / "run", [s], faults=faults))[("f1", GR)]
    assert row["applicable"] is True and row["sessions_affected"] is None
    assert "did not happen" in row["note"]


def test_finalize_writes_faults_csv_and_the_summary_s_faults(tmp_path):
    directory = relay_kill_world(tmp_path / "run")
    summary = finalize(directory)
    assert [r["fault"] for r in summary["faults"]] == ["f1", "f2"]
    doc = json.loads((directory / "summary.json").read_text())
    assert doc["faults"][0]["gap_down_max_ms"] == 700.0
    with open(directory / "faults.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == FAULT_FIELDS
        rows = list(reader)
    assert rows[0]["sessions_affected"] == "3" and rows[0]["first_new_session_s"] == ""
    back = read_faults_csv(directory / "faults.csv")
    assert back[0]["recovery_s"] == 0.8 and back[0]["applicable"] is True
    assert back[0]["extra_rtt_ms"] is None


def test_a_run_without_faults_has_no_faults_csv(tmp_path):
    directory = relay_kill_world(tmp_path / "run")
    (directory / "faults.json").unlink()
    summary = finalize(directory)
    assert "faults" not in summary and not (directory / "faults.csv").exists()
    assert load_results(directory).faults == []


# ------------------------------------------------------------------ plot and report

def outage_world(directory: Path) -> Path:
    """apac-se calls steered to na-east until its outage at AT, to eu-west during it, back to
    na-east after it ended (AT + 5)."""
    a = session(0, T0, T0 + 30, reconnections=1)
    b = session(1, T0 + 1, T0 + 30)
    attempts = first_attempts([a, b]) + [
        attempt(a, 1, AT + 1.0, AT + 1.6, cluster="eu-west"),
        attempt(b, 1, AT + 1.1, AT + 1.8, cluster="eu-west")]
    gaps = [gap(a, "down", AT - 0.01, 1610.0, 1), gap(b, "down", AT, 1810.0, 1),
            gap(b, "up", AT + 0.01, 1900.0, 1)]
    call = {"architecture": GR, "client_region": "apac-se", "front": "front-apac-se",
            "event": "call_created", "nearest": True, "reason": "nearest"}
    steering = [call | {"call": "x0", "cluster": "na-east", "unix": T0},
                call | {"call": "x1", "cluster": "na-east", "unix": T0 + 1},
                {"architecture": GR, "client_region": "apac-se", "front": "front-apac-se",
                 "event": "steering_changed", "cluster": "eu-west", "reason": "na-east down",
                 "unix": AT + 0.4},
                call | {"call": "x2", "cluster": "eu-west", "unix": AT + 1.0, "nearest": False,
                        "reason": "na-east down"},
                call | {"call": "x3", "cluster": "eu-west", "unix": AT + 1.1, "nearest": False,
                        "reason": "na-east down"},
                {"architecture": GR, "client_region": "apac-se", "front": "front-apac-se",
                 "event": "steering_changed", "cluster": "na-east", "reason": "nearer",
                 "unix": AT + 7.0},
                call | {"call": "x4", "cluster": "na-east", "unix": AT + 8.0}]
    # a relay kill before: it moves no call, so "before" still counts from the start
    faults = [fault("kill", "relay_kill", "cluster/na-east", at=AT - 5, end=AT - 4.5,
                    ready=AT - 4, redis=True),
              fault("outage", "cluster_outage", "cluster/na-east", at=AT, end=AT + 5.0)]
    return write_folder(directory, [a, b], attempts=attempts, gaps=gaps, faults=faults,
                        steering=steering)


def test_a_timeline_per_fault(tmp_path):
    from analysis import plots

    results = load_results(relay_kill_world(tmp_path / "run"))
    written = plots.write_fault_plots(results, tmp_path / "plots")
    assert set(written) == {"fault-f1", "fault-f2"}
    for path in written.values():
        assert path.parent == tmp_path / "plots" and path.read_bytes()[:4] == b"\x89PNG"
        assert path.stat().st_size > 10_000
    assert plots.fault_plot_name("kill relay/na east") == "fault-kill_relay_na_east"
    # the downstream bar: first to last packet, minus the gaps
    assert plots._present(0.0, 10.0, [(2.0, 500.0), (1.0, 300.0)]) == [
        (0.0, 1.0), (1.3, 0.7), (2.5, 7.5)]


def test_the_report_has_a_faults_section_with_steering_around_the_outage(tmp_path):
    directory = outage_world(tmp_path / "run")
    html_path, md_path = write_report(directory, tmp_path / "report")
    page = html.unescape(html_path.read_text())
    assert "<h2 id='faults'>Faults</h2>" in page and "What each fault hit" in page
    assert page.index("id='faults'") < page.index("id='plots'")
    assert "fault-outage" in page and "This run injected faults" in page
    md = md_path.read_text()
    assert "![fault-outage](plots/fault-outage.png)" in md
    assert (tmp_path / "report" / "plots" / "fault-outage.png").is_file()
    # before: both calls on na-east; during: both on eu-west; after (AT + 5 on): back
    assert ("| outage | global-relay | apac-se | na-east 2 | eu-west 2 | na-east 1 | "
            "+0.4: eu-west (na-east down); +7.0: na-east (nearer) |") in md
    assert "| outage | cluster_outage | cluster/na-east | global-relay | 10.0 | 5.00 |" in md
    # down gaps [1610, 1810]: p95 = 1610 + 0.95 x 200; up [0 (a has none), 1900]; recovery:
    # b's gap from the outage to +1.81 s
    assert "| outage | global-relay | 1710 / 1800 / 1810 | 950 / 1805 / 1900 | 1.81 |" in md
    assert "| 10.0 | 5.00 | - | 2 | 2 | 0 | 2 (0) | 2 | - | 1.60 |" in md  # a back on eu-west


def test_the_report_of_a_run_without_steering_times_says_so(tmp_path):
    directory = outage_world(tmp_path / "run")
    frame = (directory / "steering.csv").read_text().splitlines()
    (directory / "steering.csv").write_text("\n".join(
        line.rsplit(",", 1)[0] for line in frame) + "\n")
    _, md_path = write_report(directory, tmp_path / "report")
    assert "No steering times" in md_path.read_text()


# ------------------------------------------------------------------ fault budgets

def _verdicts(directory: Path, *budgets: FaultBudget):
    finalize(directory)
    return check_faults(directory, budgets)


def test_fault_budgets_pass_and_fail_on_the_measured_value(tmp_path):
    directory = relay_kill_world(tmp_path / "run")
    gap_ok, lost, outage = _verdicts(
        directory,
        FaultBudget("relay_kill", "gap_over_restart_ms", GR, max=50, redis=True),
        FaultBudget("f1", "sessions_lost", max=0),
        FaultBudget("cluster_outage", "recovery_s", "*", max=1.5))
    assert gap_ok.ok and gap_ok.measured == -200.0 and gap_ok.margin == 250.0
    assert gap_ok.fault == "f1" and gap_ok.sessions == 3 and gap_ok.set == "fault"
    assert not lost.ok and lost.measured == 1.0       # s2 was lost
    assert not outage.ok and outage.measured == 1.7 and outage.fault == "f2"
    [low] = _verdicts(directory, FaultBudget("f2", "sessions_affected", min=4))
    assert not low.ok and low.measured == 3.0


def test_a_budget_on_a_missing_fault_fails(tmp_path):
    directory = relay_kill_world(tmp_path / "run")
    missing, no_redis, other_arch = _verdicts(
        directory, FaultBudget("redis_down", "sessions_lost", max=0),
        FaultBudget("relay_kill", "gap_over_restart_ms", max=50, redis=False),
        FaultBudget("f1", "sessions_lost", PPS, max=0))
    for v in (missing, no_redis, other_arch):
        assert not v.ok and v.measured is None and "no such fault" in v.note


def test_a_budget_on_a_fault_that_does_not_apply_or_was_not_measured_fails(tmp_path):
    s = session(0, T0, T0 + 30, arch=PPS)
    faults = [fault("f1", "relay_kill", "cluster/na-east", arch=PPS, applicable=False,
                    note="no relay in port-per-session"),
              fault("f2", "cluster_outage", "cluster/na-east", arch=PPS, at=AT, end=AT + 2)]
    directory = write_folder(tmp_path / "run", [s], faults=faults, archs=(PPS,))
    star, named, unmeasured = _verdicts(
        directory, FaultBudget("relay_kill", "sessions_lost", max=0),
        FaultBudget("f1", "sessions_lost", PPS, max=0),
        FaultBudget("f2", "first_new_session_s", max=2))
    assert not star.ok and "not applicable: no relay" in star.note
    assert not named.ok and "not applicable" in named.note
    assert not unmeasured.ok and unmeasured.note.startswith("not measured")


def test_fault_budgets_load_and_bad_ones_are_refused(tmp_path):
    shipped = BudgetFile.load().faults
    assert shipped.scenario == "scenarios/ci-faults.yaml" and shipped.region == "apac-se"
    assert {(b.fault, b.metric, b.max) for b in shipped.budgets} >= {
        ("relay_kill", "gap_over_restart_ms", 50), ("relay_kill", "sessions_lost", 0),
        ("cluster_outage", "first_new_session_s", 2), ("cluster_outage", "recovery_p50_s", 3),
        ("cluster_outage", "sessions_lost", 0)}
    bad = tmp_path / "b.yaml"
    head = "budgets:\n  - {architecture: x, metric: success_pct, min: 100}\n"
    for body in ("faults: {scenario: s.yaml, budgets: [{fault: f1, metric: nonsense, max: 1}]}",
                 "faults: {scenario: s.yaml, budgets: [{fault: f1, metric: recovery_s}]}",
                 "faults: {scenario: s.yaml, budgets: [{fault: f1, metric: recovery_s, max: 1, "
                 "min: 0}]}",
                 "faults: {budgets: [{fault: f1, metric: recovery_s, max: 1}]}"):
        bad.write_text(head + body + "\n")
        with pytest.raises(BudgetError, match="fault"):
            BudgetFile.load(bad)
    bad.write_text(head)
    assert BudgetFile.load(bad).faults is None


def _budgets_file(path: Path, fault_budgets: str) -> Path:
    path.write_text("scenario: scenarios/ci.yaml\nregion: apac-se\nbudgets:\n"
                    "  - {architecture: '*', metric: success_pct, min: 100}\n"
                    f"faults:\n  scenario: scenarios/ci-faults.yaml\n  region: apac-se\n"
                    f"  budgets:\n{fault_budgets}")
    return path


def test_the_cli_checks_a_fault_run_against_the_fault_budgets(tmp_path):
    directory = relay_kill_world(tmp_path / "run")
    finalize(directory)
    passing = _budgets_file(tmp_path / "ok.yaml",
                            "    - {fault: relay_kill, metric: gap_over_restart_ms, max: 50}\n")
    cmd = [sys.executable, "-m", "voiceedge", "budgets", str(directory), "--budgets"]
    proc = subprocess.run(cmd + [str(passing), "--json"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    [v] = json.loads(proc.stdout)
    assert (v["set"], v["fault"], v["measured"], v["ok"]) == ("fault", "f1", -200.0, True)
    failing = _budgets_file(tmp_path / "bad.yaml",
                            "    - {fault: relay_kill, metric: sessions_lost, max: 0}\n"
                            "    - {fault: redis_down, metric: sessions_lost, max: 0}\n")
    proc = subprocess.run(cmd + [str(failing)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 1 and "OVER" in proc.stdout and "fault budgets" in proc.stdout
    assert "no such fault" in proc.stdout


def test_a_run_of_the_mobility_scenario_is_checked_against_the_mobility_budgets(tmp_path):
    """The budgets file's ``mobility`` section gates a run of the scenario it names (its
    ``name``), the ``faults`` section every other fault run: the rebinding's worst call, 140
    ms past its detection and RTT, is over a 100 ms budget."""
    folder = rebind_world(tmp_path / "run")
    config = json.loads((folder / "config.json").read_text())
    config["scenario"]["name"] = "mobility"
    (folder / "config.json").write_text(json.dumps(config))
    finalize(folder)
    budgets = _budgets_file(tmp_path / "b.yaml",
                            "    - {fault: relay_kill, metric: sessions_lost, max: 0}\n")
    budgets.write_text(budgets.read_text() + (
        "mobility:\n  scenario: scenarios/mobility.yaml\n  region: apac\n  budgets:\n"
        "    - {fault: nat_rebind, metric: sessions_lost, max: 0}\n"
        "    - {fault: nat_rebind, metric: gap_over_detection_rtt_max_ms, max: 100}\n"))
    cmd = [sys.executable, "-m", "voiceedge", "budgets", str(folder), "--budgets", str(budgets),
           "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stderr
    verdicts = {v["budget"]: (v["measured"], v["ok"]) for v in json.loads(proc.stdout)}
    assert len(verdicts) == 2, verdicts          # the mobility set alone, not relay_kill's
    assert (140.0, False) in verdicts.values() and (0.0, True) in verdicts.values()
    # a fault run of another scenario stays the fault budgets'
    config["scenario"]["name"] = "ci-faults"
    (folder / "config.json").write_text(json.dumps(config))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert "no such fault" in proc.stdout


def test_voiceedge_budgets_runs_both_scenarios_and_gates_each_with_its_set(tmp_path,
                                                                          monkeypatch, capsys):
    import argparse

    fault_run = relay_kill_world(tmp_path / "fault-run")
    finalize(fault_run)
    latency_run = tmp_path / "latency-run"
    latency_run.mkdir()
    (latency_run / "sessions.csv").write_text("architecture,client_region,ok\n" + "".join(
        f"{GR},apac-se,True\n" for _ in range(4)))
    ran = []

    def fake_run(cmd, stdout=None):
        scenario = Path(cmd[cmd.index("scenario") + 1])
        out = Path(cmd[cmd.index("--results") + 1])
        ran.append((scenario.name, cmd[cmd.index("--region") + 1]))
        (out / scenario.stem).symlink_to(fault_run if "faults" in scenario.name
                                         else latency_run)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(budgets_cli, "run_child", fake_run)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its results folders go here
    monkeypatch.setattr(budgets_cli, "_scenario", lambda name, path, file: path)
    budgets = _budgets_file(tmp_path / "b.yaml",
                            "    - {fault: relay_kill, metric: gap_over_restart_ms, max: 50}\n")

    def args(*extra):
        p = argparse.ArgumentParser()
        budgets_cli.add_parser(p.add_subparsers())
        return p.parse_args(["budgets", "--budgets", str(budgets), "--json", *extra])

    assert budgets_cli.run(args()) == 0
    assert ran == [("ci.yaml", "apac-se"), ("ci-faults.yaml", "apac-se")]
    doc = json.loads(capsys.readouterr().out)
    assert [v["set"] for v in doc] == ["latency", "fault"]
    ran.clear()
    assert budgets_cli.run(args("--only", "faults")) == 0
    assert ran == [("ci-faults.yaml", "apac-se")]
    assert [v["set"] for v in json.loads(capsys.readouterr().out)] == ["fault"]
    ran.clear()
    assert budgets_cli.run(args("--only", "latency")) == 0
    assert ran == [("ci.yaml", "apac-se")]
    capsys.readouterr()
    ran.clear()
    # folders: each checked against the set its files say
    assert budgets_cli.run(args(str(latency_run), str(fault_run))) == 0 and not ran
    assert [v["set"] for v in json.loads(capsys.readouterr().out)] == ["latency", "fault"]
    # a latency folder forced through the fault budgets has no faults: it fails
    with pytest.raises(Exception, match="no faults.csv"):
        budgets_cli.run(args("--only", "faults", str(latency_run)))


def test_the_shipped_fault_scenario_is_where_the_budgets_say():
    scenario = BudgetFile.load().faults.scenario_path()
    assert scenario == REPO / "scenarios" / "ci-faults.yaml"
    mobility = BudgetFile.load().mobility
    assert mobility.scenario_path() == REPO / "scenarios" / "mobility.yaml"
    assert budgets_cli._name_of(mobility.scenario_path()) == "mobility"


def test_a_call_that_ends_before_its_audio_is_back_counts_its_silence_to_its_end(tmp_path):
    """A transceiver crash 1.8 s before a call's planned end (connected + call_duration_s):
    the client's reconnection connects after that end, so no packet ever closes the silence.
    Its gap runs from the last packet to the planned end; it has no recovery time; a second
    call that got its audio back has one."""
    s0 = session(0, T0, AT + 5.0, rx=(T0 + 1.0, AT + 0.1))   # connected T0+0.7: ends AT+1.9
    s1 = session(1, T0 + 1, T0 + 30)
    gaps = [gap(s1, "down", AT + 0.1, 2400.0, 1)]
    folder = write_folder(tmp_path / "r", [s0, s1], gaps=gaps, faults=[
        fault("crash", "transceiver_crash", "cluster/na-east", at=AT, ready=AT + 4.0)])
    config = json.loads((folder / "config.json").read_text())
    config["scenario"]["call_duration_s"] = AT + 1.9 - (T0 + 0.7)
    (folder / "config.json").write_text(json.dumps(config))
    row = rows_by(folder)[("crash", GR)]
    from analysis import plots
    [png] = plots.write_fault_plots(load_results(folder), tmp_path / "plots").values()
    assert png.read_bytes()[:4] == b"\x89PNG"  # the silent call is drawn too
    assert row["sessions_affected"] == 2 and row["sessions_lost"] == 0
    assert row["gap_down_max_ms"] == pytest.approx(2400.0)
    assert sorted([row["gap_down_p50_ms"], row["gap_down_max_ms"]])[0] == pytest.approx(2100.0)
    assert row["recovery_s"] == pytest.approx(2.5)  # s1's audio back at AT + 2.5; s0 has none
    assert row["recovery_p50_s"] == pytest.approx(2.5)  # the silent call is not a 0
    assert "planned end" in row["note"]
    # without the call length (older folders) the silence is not invented
    del config["scenario"]["call_duration_s"]
    (folder / "config.json").write_text(json.dumps(config))
    row = rows_by(folder)[("crash", GR)]
    assert row["gap_down_p50_ms"] == pytest.approx(1200.0)  # median of 0 and 2400


def test_a_call_still_setting_up_at_the_fault_is_counted_apart(tmp_path):
    """A call that started 0.2 s before an outage and had no audio yet was not in progress:
    it is not affected (its wait is not a gap in a call) but counted as setting up, with when
    its first audio came; the call in progress is the affected one."""
    s0 = session(0, T0, T0 + 30)                                  # in progress
    s1 = session(1, AT - 0.2, AT + 20, rx=(AT + 11.0, AT + 19.0))  # first audio 11 s after
    gaps = [gap(s0, "down", AT + 0.1, 2500.0, 1)]
    folder = write_folder(tmp_path / "r", [s0, s1], gaps=gaps, faults=[
        fault("out", "cluster_outage", "cluster/na-east", at=AT)])
    row = rows_by(folder)[("out", GR)]
    assert row["sessions_live"] == 2 and row["sessions_affected"] == 1
    assert row["setting_up"] == 1 and row["first_audio_after_s"] == pytest.approx(11.0)
    assert row["recovery_s"] == pytest.approx(2.6) and row["recovery_p50_s"] == pytest.approx(2.6)
    assert "still setting up" in row["note"]


# ------------------------------------------------------------------ calls that moved

def rebind_world(directory: Path) -> Path:
    """A NAT rebinding in front of apac-se at AT, two global-relay calls from there: each went
    silent, its client renominated 500 ms after its last packet and the media came back; a
    third call from another region was not behind that NAT. Media RTT 240 ms each."""
    s0 = session(0, T0, T0 + 30)
    s0["renominated"] = json.dumps([[AT + 0.05, AT + 0.55, AT + 0.81]])
    s1 = session(1, T0 + 1, T0 + 30)
    s1["renominated"] = json.dumps([[AT + 0.02, AT + 0.52, AT + 0.9]])
    s0["moved"] = json.dumps([[AT + 0.68, "10.1.7.1:40127", "10.1.7.1:10429"]])
    s1["moved"] = json.dumps([[AT - 5.0, "10.1.1.2:5000", "10.1.7.1:40128"],   # before: not it
                              [AT + 0.77, "10.1.7.1:40128", "10.1.7.1:10430"]])
    s2 = session(2, T0 + 2, T0 + 30, region="eu-west")
    gaps = [gap(s0, "down", AT + 0.05, 760.0), gap(s1, "down", AT + 0.02, 880.0)]
    rebind = fault("rebind", "nat_rebind", "last_mile/apac-se", at=AT, end=AT, ready=AT)
    rebind["effect"] = {"hits": ["last_mile/apac-se"],
                        "measures": ["gap_over_detection_rtt_max_ms"]}
    return write_folder(directory, [s0, s1, s2], gaps=gaps, faults=[rebind])


def test_a_rebinding_measures_each_calls_gap_beyond_its_detection_and_rtt(tmp_path):
    """The target (a moved call's gap at most detection + one RTT + 100 ms) per call: s0 760
    - 500 - 240 = 20, s1 880 - 500 - 240 = 140; the row carries the worst, and the report's
    "Calls that moved" table shows it. A kind that does not measure it has none."""
    folder = rebind_world(tmp_path / "r")
    row = rows_by(folder)[("rebind", GR)]
    assert row["sessions_affected"] == 2 and row["sessions_lost"] == 0
    assert row["renominations"] == 2 and row["detection_p50_ms"] == pytest.approx(500.0)
    assert row["gap_over_detection_rtt_max_ms"] == pytest.approx(140.0)
    assert (row["sessions_moved"], row["moved_to"]) == (2, "10.1.7.1")  # the same sessions
    md = write_report(folder, tmp_path / "report")[1].read_text()
    assert "### Calls that moved" in md
    [line] = [x for x in md.splitlines() if x.startswith("| rebind ")
              and "nat_rebind" in x and "+140" in x]
    assert "| 2 | 0 |" in line and "| 2 (10.1.7.1) |" in line
    killed = rows_by(relay_kill_world(tmp_path / "k"))
    assert all(r["gap_over_detection_rtt_max_ms"] is None for r in killed.values())
    md = write_report(tmp_path / "k", tmp_path / "report-k")[1].read_text()
    assert "Calls that moved" not in md


def test_an_ice_restart_counts_each_calls_restarts_and_its_gap_beyond_one_rtt(tmp_path):
    """Two apac-se calls restart ICE at AT: s0's restart done in 480 ms without a gap, s1's in
    520 ms with a 300 ms down gap (300 - 240 = 60 over its RTT); a third call's restart
    failed; one restart before the fault is not this fault's. The row carries the counts,
    the p50 / max and the worst gap over RTT (60: the target's 50 is missed), and the report's
    table shows them."""
    s0 = session(0, T0, T0 + 30)
    s0["ice_restarts"] = json.dumps([[AT - 5.0, True, 200.0, 470.0, None],
                                     [AT + 0.01, True, 210.0, 480.0, None]])
    s1 = session(1, T0 + 1, T0 + 30)
    s1["ice_restarts"] = json.dumps([[AT + 0.02, True, 220.0, 520.0, None]])
    s2 = session(2, T0 + 2, T0 + 30)
    s2["ice_restarts"] = json.dumps([[AT + 0.03, False, None, None, "PATCH answered 409"]])
    gaps = [gap(s1, "down", AT + 0.2, 300.0)]
    restart = fault("restart", "ice_restart", "last_mile/apac-se", at=AT, end=AT, ready=AT)
    restart["effect"] = {"hits": ["last_mile/apac-se"], "measures": ["gap_over_rtt_max_ms"]}
    folder = write_folder(tmp_path / "r", [s0, s1, s2], gaps=gaps, faults=[restart])
    row = rows_by(folder)[("restart", GR)]
    assert row["sessions_affected"] == 3 and row["sessions_lost"] == 0
    assert (row["ice_restarts"], row["ice_restarts_failed"]) == (2, 1)
    assert row["ice_restart_p50_ms"] == pytest.approx(500.0)
    assert row["ice_restart_max_ms"] == pytest.approx(520.0)
    assert row["gap_over_rtt_max_ms"] == pytest.approx(60.0)   # s1; s0: 0 - 240; s2: 0 - 240
    assert row["gap_over_detection_rtt_max_ms"] is None
    md = write_report(folder, tmp_path / "report")[1].read_text()
    [line] = [x for x in md.splitlines() if x.startswith("| restart ") and "| 2 / 1 |" in x]
    assert "| 500 / 520 |" in line and "+60" in line


def test_a_handover_measures_each_calls_gap_beyond_its_detection_and_its_restart(tmp_path):
    """Three apac-se calls move to another access network at AT and restart ICE: s0's PATCH
    10 ms after the fault, done in 590 ms, a 620 ms down gap (620 - 10 - 590 = +20); s1's 20
    ms after, 600 ms, a 760 ms gap (+140); s2's 30 ms after, failed, a 200 ms gap (the whole
    gap counts: +170). The row carries the detection p50 (20 ms), the restarts and the worst
    call's excess; the report's table shows them."""
    s0 = session(0, T0, T0 + 30)
    s0["ice_restarts"] = json.dumps([[AT + 0.01, True, 250.0, 590.0, None, "network"]])
    s1 = session(1, T0 + 1, T0 + 30)
    s1["ice_restarts"] = json.dumps([[AT + 0.02, True, 260.0, 600.0, None, "network"]])
    s2 = session(2, T0 + 2, T0 + 30)
    s2["ice_restarts"] = json.dumps([[AT + 0.03, False, None, None, "PATCH failed", "network"]])
    gaps = [gap(s0, "down", AT, 620.0), gap(s1, "down", AT, 760.0),
            gap(s2, "down", AT + 0.5, 200.0)]
    moved = fault("moved", "handover", "last_mile/apac-se", at=AT, end=AT, ready=AT)
    moved["effect"] = {"hits": ["last_mile/apac-se"],
                       "measures": ["gap_over_detection_restart_max_ms"]}
    folder = write_folder(tmp_path / "h", [s0, s1, s2], gaps=gaps, faults=[moved])
    row = rows_by(folder)[("moved", GR)]
    assert row["sessions_affected"] == 3 and row["sessions_lost"] == 0
    assert (row["ice_restarts"], row["ice_restarts_failed"]) == (2, 1)
    assert row["detection_p50_ms"] == pytest.approx(20.0)
    assert row["gap_over_detection_restart_max_ms"] == pytest.approx(170.0)
    assert row["gap_over_rtt_max_ms"] is None
    md = write_report(folder, tmp_path / "report")[1].read_text()
    [line] = [x for x in md.splitlines() if x.startswith("| moved ") and "| 2 / 1 |" in x]
    assert "| 2 / 1 |" in line and "| 20 |" in line and "+170" in line


# ------------------------------------------------------------------ kinds are data

def test_a_kind_the_analysis_has_never_heard_of_is_measured_by_what_its_record_says(tmp_path):
    """A made-up kind whose record says it hits the last mile of au, fills the first call
    elsewhere and steers calls: its row and the report come from that alone."""
    on = session(0, T0, T0 + 30, region="au")
    other = session(1, T0, T0 + 30)                    # apac-se: not on au's last mile
    new = session(2, AT + 1.0, T0 + 30)                # apac-se, after the fault
    attempts = first_attempts([on, other]) + [
        attempt(on, 1, AT + 0.5, AT + 0.9, cluster="na-east"),   # still on au's last mile
        attempt(new, 0, AT + 1.0, AT + 1.4, cluster="na-east")]  # off it
    gaps = [gap(on, "down", AT + 0.1, 800.0, 1)]
    rebind = fault("rebind", "nat_rebind", "cluster/na-east", at=AT, end=AT + 0.2)
    rebind["effect"] = {"hits": ["last_mile/au"], "measures": ["first_new_session_s"],
                        "steers": True}
    call = {"architecture": GR, "client_region": "au", "front": "front-au",
            "event": "call_created", "nearest": True, "reason": "nearest"}
    steering = [call | {"call": "y0", "cluster": "na-east", "unix": T0},
                call | {"call": "y1", "cluster": "eu-west", "unix": AT + 0.1},
                call | {"call": "y2", "cluster": "na-east", "unix": AT + 1.0}]
    directory = write_folder(tmp_path / "run", [on, other, new], attempts=attempts,
                             gaps=gaps, faults=[rebind], steering=steering)
    row = rows_by(directory)[("rebind", GR)]
    assert (row["sessions_live"], row["sessions_affected"]) == (2, 1)  # au's, not apac-se's
    assert row["gap_down_max_ms"] == 800.0 and row["recovery_s"] == 0.9
    assert row["reconnections"] == 1
    assert row["first_new_session_s"] == 1.4  # apac-se's new call; au's retry crossed it
    assert row["gap_over_restart_ms"] is None and row["extra_rtt_ms"] is None
    _, md_path = write_report(directory, tmp_path / "report")
    md = md_path.read_text()
    assert "### Steering around the outage" in md
    assert "| rebind | global-relay | au | na-east 1 | eu-west 1 | na-east 1 | none |" in md


def test_a_record_s_effect_wins_over_what_its_kind_meant_before(tmp_path):
    """A relay kill whose record says it measures nothing beyond every kind's columns: no gap
    over restart, though the same folder without the effect (an older run) has one."""
    directory = relay_kill_world(tmp_path / "run")
    doc = json.loads((directory / "faults.json").read_text())
    assert rows_by(directory)[("f1", GR)]["gap_over_restart_ms"] == -200.0
    doc["faults"][0]["effect"] = {"hits": ["cluster/na-east"], "measures": [], "steers": False}
    (directory / "faults.json").write_text(json.dumps(doc))
    row = rows_by(directory)[("f1", GR)]
    assert row["gap_over_restart_ms"] is None
    assert row["sessions_affected"] == 3 and row["restart_s"] == 0.9  # every kind's columns


def test_a_fault_hits_the_sessions_of_its_effect_s_targets(tmp_path):
    """``hits`` other than the target: a cluster fault that hits only transceiver 2's calls,
    and one that hits two clusters."""
    a = session(0, T0, T0 + 30, transceiver=1)
    b = session(1, T0, T0 + 30, transceiver=2)
    c = session(2, T0, T0 + 30, cluster="eu-west")
    narrow = fault("narrow", "made_up", "cluster/na-east", at=AT, end=AT + 1)
    narrow["effect"] = {"hits": ["cluster/na-east/2"], "measures": [], "steers": False}
    wide = fault("wide", "made_up", "cluster/na-east", at=AT + 5, end=AT + 6)
    wide["effect"] = {"hits": ["cluster/na-east", "cluster/eu-west"]}
    rows = rows_by(write_folder(tmp_path / "run", [a, b, c], faults=[narrow, wide]))
    assert (rows[("narrow", GR)]["sessions_live"], rows[("narrow", GR)]["sessions_affected"]) \
        == (3, 1)
    assert rows[("wide", GR)]["sessions_affected"] == 3
