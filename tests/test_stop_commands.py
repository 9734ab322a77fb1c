"""Every long command, stopped mid-run by SIGTERM, SIGHUP or SIGINT, leaves nothing behind: no
process, no namespace, no interface or iptables rule in the root namespace, no temporary folder
(voiceedge/stopsignals.py, voiceedge/reaper.py; docs/logs.md, "Stopping a command").

Each command runs as a child with a marker in its environment, which every process it starts
inherits (services, clients, Mininet's host shells, the watchdog); the run's processes are
those and any process in a network namespace of theirs (redis-server rewrites its
environment). It is stopped once its services are up, and afterwards none of them may be left,
even one re-parented to init. Its TMPDIR is a folder of the test's, which must end empty. Needs root.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO


MARKER = "VOICEEDGE_STOP_TEST"
# The edge of the one-host commands (demo edge, the hostile benches): its five services.
EDGE = ("redis-server", "voiceedge relay", "voiceedge transceiver", "voiceedge agent",
        "voiceedge signaling")  # redis: found by its namespace (it rewrites its environment)


# ------------------------------------------------------------------ what a run may leave


def _read(pid: int, what: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{what}", "rb") as f:
            return f.read()
    except OSError:
        return None


def _ticks(pid: int) -> int | None:
    """When ``pid`` started, or None if it is gone (or a zombie)."""
    stat = _read(pid, "stat")
    if stat is None:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    return (_read(pid, "cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()


# The namespace the commands start in. Not /proc/1's: in a container that link may not be
# readable, and a None here would make every process of the machine look like the run's.
HOME_NETNS = os.readlink("/proc/self/ns/net")


def run_processes(marker: str, since: int) -> dict[tuple[int, int], str]:
    """The live processes of a run: those with ``MARKER=marker`` in their environment, and
    every process started since ``since`` (clock ticks) inside a network namespace one of them
    is in, other than this test's own (redis-server rewrites its environment). (pid, start
    ticks) -> command line."""
    needle = f"{MARKER}={marker}".encode()
    pids = [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != os.getpid()]
    found, spaces = {}, set()
    for pid in pids:
        if needle in (_read(pid, "environ") or b"").split(b"\0"):
            ticks = _ticks(pid)
            if ticks is not None and ticks >= since:
                found[(pid, ticks)] = _cmdline(pid)
                spaces.add(_netns(pid))
    spaces -= {HOME_NETNS, None}
    for pid in pids:
        if _netns(pid) in spaces:
            ticks = _ticks(pid)
            if ticks is not None and ticks >= since:
                found.setdefault((pid, ticks), _cmdline(pid))
    return found


def _lines(cmd: list[str]) -> set[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return set(proc.stdout.splitlines())


def machine() -> dict[str, set[str]]:
    """What the root namespace holds that a run could leave: named namespaces, interfaces,
    iptables rules (counters dropped)."""
    links = {line.split(": ")[1].split("@")[0] for line in _lines(["ip", "-o", "link"])}
    rules = {line.split(" [")[0] if line.startswith(":") else line
             for line in _lines(["iptables-save"]) if not line.startswith("#")}
    return {"namespaces": {line.split()[0] for line in _lines(["ip", "netns", "list"]) if line},
            "interfaces": links, "iptables": rules}


# ------------------------------------------------------------------ one stopped run


@dataclass
class Case:
    args: list[str]                 # after `voiceedge`
    ready: tuple[str, ...] = ()     # command-line words of marked processes that mean "up"
    ready_out: str | None = None    # or: a line on stdout
    sig: int = signal.SIGTERM
    status: int | None = None       # expected exit status (default 128 + sig)
    settle_s: float = 1.0           # after ready, before the signal
    stops_within_s: float = 120.0   # from the signal to its exit
    files: dict[str, str] = field(default_factory=dict)  # name -> text, in the test's folder


def run_and_stop(case: Case, tmp_path: Path, ready_timeout: float = 120.0) -> dict:
    marker = uuid.uuid4().hex
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    for name, text in case.files.items():
        (tmp_path / name).write_text(text)
    args = [a.format(tmp=tmp_path) for a in case.args]
    env = {**os.environ, MARKER: marker, "TMPDIR": str(tmpdir)}
    before = machine()
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "voiceedge", *args], cwd=REPO, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)  # the signal is for it alone
    since = _ticks(proc.pid)
    if since is None:  # gone already: nothing of it can be running
        proc.wait()
        pytest.fail(f"voiceedge {' '.join(args)} exited at once:\n{err_path.read_text()}")
    seen: dict[tuple[int, int], str] = {}
    try:
        deadline = time.monotonic() + ready_timeout
        while not _ready(case, seen, marker, since, out_path):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"voiceedge {' '.join(args)} not up in {ready_timeout:g} s (exit "
                            f"{proc.poll()}):\n{err_path.read_text()[-3000:]}")
            time.sleep(0.1)
        time.sleep(case.settle_s)
        seen.update(run_processes(marker, since))
        assert proc.poll() is None, err_path.read_text()[-3000:]
        proc.send_signal(case.sig)
        try:
            proc.wait(timeout=case.stops_within_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"voiceedge {' '.join(args)} still running {case.stops_within_s:g} s "
                        f"after the signal")
        # the watchdog (and anything it reaps) takes a few seconds more at most
        deadline = time.monotonic() + 15
        while _alive(seen, marker, since) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _alive(seen, marker, since)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid, _ in _alive(seen, marker, since):  # a failing run's: the next test starts clean
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    after = machine()
    return {"status": proc.returncode, "stderr": err_path.read_text(),
            "processes": sorted(left.values()),
            **{k: sorted(after[k] - before[k]) for k in before},
            "temporary": sorted(p.name for p in tmpdir.iterdir())}


def _ready(case: Case, seen: dict, marker: str, since: int, out_path: Path) -> bool:
    running = run_processes(marker, since)
    seen.update(running)
    if case.ready_out is not None and case.ready_out not in out_path.read_text():
        return False
    return all(word in " | ".join(running.values()) for word in case.ready)


def _alive(seen: dict, marker: str, since: int) -> dict[tuple[int, int], str]:
    """Processes of the run still there: any seen during it, and any new one of it."""
    left = {key: cmd for key, cmd in seen.items() if _ticks(key[0]) == key[1]}
    return {**left, **run_processes(marker, since)}


def assert_nothing_left(case: Case, found: dict) -> None:
    assert {k: found[k] for k in ("processes", "namespaces", "interfaces", "iptables",
                                  "temporary")} == \
        {"processes": [], "namespaces": [], "interfaces": [], "iptables": [], "temporary": []}
    expected = case.status if case.status is not None else 128 + case.sig
    assert found["status"] == expected, found["stderr"][-3000:]
    assert "Traceback" not in found["stderr"], found["stderr"][-3000:]


# ------------------------------------------------------------------ the commands

SWEEP = (REPO / "scenarios" / "ci.yaml").read_text() + """
sweep:
  parameters:
    public_internet.rtt_scale: [1.0, 2.0]
"""

CASES = {
    # The run of issue 26: `timeout` ended it with SIGTERM in its hygiene part.
    "bench hostile": pytest.param(Case(
        ["bench", "hostile", "--parts", "hygiene", "--quick"], ready=EDGE),
        marks=pytest.mark.netns),
    "bench capacity": pytest.param(Case(
        ["bench", "capacity", "--sessions", "4", "--duration", "30", "--workdir",
         "{tmp}/capacity"], ready=EDGE, sig=signal.SIGHUP), marks=pytest.mark.netns),
    "demo edge": pytest.param(Case(
        ["demo", "edge", "--sessions", "4", "--duration", "30"], ready=EDGE,
         sig=signal.SIGINT, settle_s=3.0), marks=pytest.mark.netns),
    "scenario": pytest.param(Case(
        ["scenario", str(REPO / "scenarios" / "ci.yaml"), "--region", "apac-se", "--results",
         "{tmp}/results"], ready=("voiceedge client",)), marks=pytest.mark.world),
    "sweep": pytest.param(Case(
        ["sweep", "{tmp}/sweep.yaml", "--region", "apac-se", "--results", "{tmp}/results"],
        ready=("voiceedge client",), sig=signal.SIGHUP, files={"sweep.yaml": SWEEP}),
        marks=pytest.mark.world),
    # world up ends on a stop signal by design: torn down, exit 0
    "world up": pytest.param(Case(
        ["world", "up", "--regions", "apac-se", "--count", "100", "--state-dir",
         "{tmp}/state"], ready_out="world up:", status=0), marks=pytest.mark.world),
    # its probes would take 30 s more: it stops them instead of waiting for them
    "calibrate": pytest.param(Case(
        ["calibrate", "--regions", "apac-se", "--count", "3000", "--rate", "100"],
        ready=("mininet:client1",), settle_s=3.0, stops_within_s=15.0),
        marks=pytest.mark.world),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_a_stopped_command_leaves_nothing(case, tmp_path):
    assert_nothing_left(case, run_and_stop(case, tmp_path))
