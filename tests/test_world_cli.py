"""``voiceedge world up / exec / down`` on real one-region worlds (needs root).

Each world lives in a state directory of its own (the hidden --state-dir), so the tests never
meet a world someone keeps up on this machine under /run/voiceedge.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from topology.worldstate import same_process, start_ticks

pytestmark = pytest.mark.world

# 100 probes a path: with 20, the robust spread of a 1 ms jitter misses its 0.75 ms tolerance
# by chance in about 1% of paths (IQR / 1.349 of 20 samples varies by ~0.3 sd)
UP = ["--regions", "apac-se", "--count", "100"]


def world(action: str, state_dir: Path, *args: str, timeout: float = 60):
    return subprocess.run([sys.executable, "-m", "voiceedge", "world", action, "--state-dir",
                           str(state_dir), *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def _matching() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "mininet:|mnexec|topology.impairment.engine"],
                         capture_output=True, text=True).stdout.split()
    return {int(p) for p in out} - {os.getpid()}


def recorded(state: dict) -> list[dict]:
    """Every process the state file records: host shells and extra pids."""
    return [{"pid": h["pid"], "start_ticks": h["start_ticks"]} for h in state["hosts"].values()] \
        + state["extra_pids"]


def leftovers(state: dict, before: set[int]) -> dict:
    """What a world could leave: its recorded processes, new Mininet shells or engines, and
    host interfaces in the root namespace."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {"recorded": [r["pid"] for r in recorded(state)
                         if same_process(r["pid"], r["start_ticks"])],
            "processes": sorted(_matching() - before),
            "interfaces": [line.split(": ")[1] for line in links.splitlines() if "-eth" in line]}


NOTHING = {"recorded": [], "processes": [], "interfaces": []}


class Up:
    """``voiceedge world up`` as a child process, read until its ready line."""

    def __init__(self, state_dir: Path, tmp: Path, cmd: list[str] | None = None) -> None:
        self.state_dir = state_dir
        self.before = _matching()
        self.err_path = tmp / f"up-{time.monotonic_ns()}.err"
        cmd = cmd or [sys.executable, "-m", "voiceedge", "world", "up", "--state-dir",
                      str(state_dir), *UP]
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err)
        fd, out = self.proc.stdout.fileno(), b""
        deadline = time.monotonic() + 60
        while not out.endswith(b"\n") or b"world up:" not in out:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.kill()
                pytest.fail(f"world up not ready in 60 s: {out.decode()}{self.stderr()}")
            chunk = os.read(fd, 65536)
            if not chunk:
                self.proc.wait()
                pytest.fail(f"world up exited ({self.proc.returncode}): {out.decode()}"
                            f"{self.stderr()}")
            out += chunk
        self.out = out.decode()
        self.state = json.loads((state_dir / "world.json").read_text())

    def stderr(self) -> str:
        return self.err_path.read_text()

    def kill(self, reap: bool = True) -> None:
        """SIGKILL the holder; with ``reap``, then reap what it leaves (a scenario's services
        outlive it), so that a failing test leaves nothing running."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if reap and (self.state_dir / "world.json").exists():
            world("down", self.state_dir)


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    """One world up shared by the tests below; the last of them tears it down with SIGINT."""
    tmp = tmp_path_factory.mktemp("world-cli")
    held = Up(tmp / "state", tmp)
    yield held
    if held.proc.poll() is None:
        held.proc.send_signal(signal.SIGINT)
        held.proc.wait(timeout=30)


def test_up_prints_the_hosts_and_exec_runs_inside_them(up):
    assert "world up: 5 hosts; run commands with: voiceedge world exec HOST -- CMD" in up.out
    for row in ("client1", "10.1.1.2/24", "public router", "backbone router", "cluster1",
                "edge: ingress relay + signaling front", "203.0.113.10/32", "cluster1-eth1"):
        assert row in up.out, up.out
    assert "calibration passed (3 paths)" in up.stderr()
    state = up.state
    assert state["holder"]["pid"] == up.proc.pid and state["regions"] == ["apac-se"]
    assert list(state["hosts"]) == ["client1", "pub1", "edge1", "bb1", "cluster1"]
    assert state["hosts"]["client1"]["addresses"] == [{"interface": "client1-eth0",
                                                       "address": "10.1.1.2/24"}]
    if state["backend"] == "userspace":
        [engine] = state["extra_pids"]
        assert engine["what"] == "impairment engine" and same_process(engine["pid"],
                                                                      engine["start_ticks"])

    run = world("exec", up.state_dir, "client1", "--", "ip", "-4", "-br", "addr")
    assert run.returncode == 0 and "10.1.1.2/24" in run.stdout, run
    assert "10.1.1.2/" not in subprocess.run(["ip", "-4", "-br", "addr"], capture_output=True,
                                             text=True).stdout  # not the root namespace's
    across = world("exec", up.state_dir, "client1", "--", "ping", "-c", "1", "-W", "3",
                   "203.0.113.10")  # through pub1 to the edge's anycast address
    assert across.returncode == 0, across
    assert world("exec", up.state_dir, "client1", "--", "false").returncode == 1
    assert world("exec", up.state_dir, "edge1", "--", "sh", "-c", "exit 7").returncode == 7

    unknown = world("exec", up.state_dir, "client9", "--", "true")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert unknown.stderr == ("voiceedge world: no host 'client9' in the world; its hosts: "
                              "client1, pub1, edge1, bb1, cluster1\n")


def test_a_second_world_up_is_refused_before_it_builds(up):
    second = world("up", up.state_dir, *UP)
    assert second.returncode == 2, second
    [line] = second.stderr.splitlines()  # one line, nothing built
    assert line.startswith(f"voiceedge world: a world is already up (pid {up.proc.pid}, "
                           f"regions apac-se; since ")
    assert line.endswith("): use it with voiceedge world exec, or stop it with voiceedge "
                         "world down")


def test_no_world_exec_and_down_say_so_in_one_line(tmp_path):
    run = world("exec", tmp_path, "client1", "--", "true")
    assert (run.returncode, run.stderr) == (
        2, "voiceedge world: no world is up: start one with voiceedge world up\n")
    down = world("down", tmp_path)
    assert (down.returncode, down.stderr) == (
        2, "voiceedge world: no world is up (nothing to tear down)\n")


def test_ctrl_c_tears_the_world_down(up):
    """Last of the tests sharing the world."""
    assert leftovers(up.state, up.before)["recorded"]  # it is really there
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(timeout=30) == 0, up.stderr()
    assert "SIGINT: tearing the world down" in up.stderr()
    assert not (up.state_dir / "world.json").exists()
    assert leftovers(up.state, up.before) == NOTHING


HOLD = textwrap.dedent("""
    import subprocess, sys
    from pathlib import Path
    from topology.impairment.factory import make_backend
    from topology.plan import world_spec
    from topology.regions import RegionsCatalog
    from topology.world import World
    from topology.worldstate import WorldHold

    with World(world_spec(RegionsCatalog.load(), ["apac-se"]), make_backend()) as world:
        # a service of a scenario: in its own session, in client1's namespace
        service = subprocess.Popen(["nsenter", "--net=" + world.node("client1").ns_path,
                                    "sleep", "300"], start_new_session=True,
                                   stdin=subprocess.DEVNULL)
        with WorldHold(world, extra_pids=[service.pid], lines=[f"service {service.pid}"],
                       state_dir=Path(sys.argv[1])) as hold:
            hold.wait()
            service.kill()
""")


def test_sigkill_then_world_down_reaps_what_the_holder_recorded(tmp_path):
    script = tmp_path / "hold.py"
    script.write_text(HOLD)
    state_dir = tmp_path / "state"
    held = Up(state_dir, tmp_path, [sys.executable, str(script), str(state_dir)])
    service = int(held.out.split("service ")[1].split()[0])
    netns = os.readlink(f"/proc/{service}/ns/net")
    assert netns == os.readlink(held.state["hosts"]["client1"]["ns_path"])
    decoy = subprocess.Popen(["sleep", "300"])  # a recycled pid: recorded, not the same process
    leftover = ["client1-eth7", "pub1-eth7"]  # as a build killed half-way leaves them
    try:
        held.proc.kill()
        held.proc.wait()
        state = json.loads((state_dir / "world.json").read_text())
        state["extra_pids"].append({"pid": decoy.pid, "start_ticks": start_ticks(decoy.pid) - 1,
                                    "group": False, "what": "recycled"})
        (state_dir / "world.json").write_text(json.dumps(state))
        subprocess.run(["ip", "link", "add", leftover[0], "type", "veth", "peer", "name",
                        leftover[1]], check=True)
        assert same_process(service, start_ticks(service))  # it keeps client1's namespace

        stale = world("exec", state_dir, "client1", "--", "true")
        assert stale.returncode == 2
        assert "is stale (its holder is gone): voiceedge world down reaps it" in stale.stderr

        down = world("down", state_dir)
        assert down.returncode == 0, down
        assert down.stdout.startswith(f"world down: reaped a stale world (pid {held.proc.pid}, "
                                      f"regions apac-se; since ")
        assert "leftover interface" in down.stdout and down.stdout.count("\n") == 1
        assert start_ticks(service) is None
        assert decoy.poll() is None  # not the recorded process: left alone
        assert not (state_dir / "world.json").exists()
        in_world = [p for p in os.listdir("/proc") if p.isdigit()
                    and _readlink(f"/proc/{p}/ns/net") == netns]
        assert in_world == []  # the namespace is gone with its last process
        assert leftovers(held.state, held.before) == NOTHING
    finally:
        decoy.kill()
        decoy.wait()
        subprocess.run(["ip", "link", "del", leftover[0]], capture_output=True)
        if start_ticks(service):
            os.kill(service, signal.SIGKILL)


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def test_world_up_reaps_a_killed_world_and_world_down_stops_it(tmp_path):
    state_dir = tmp_path / "state"
    first = Up(state_dir, tmp_path)
    first.kill(reap=False)
    second = Up(state_dir, tmp_path)
    try:
        reaped = [line for line in second.stderr().splitlines() if "reaped" in line]
        assert reaped and reaped[0].startswith(f"reaped a stale world (pid {first.proc.pid}, ")
        assert leftovers(first.state, first.before)["recorded"] == []
        assert second.state["holder"]["pid"] == second.proc.pid

        down = world("down", state_dir)
        assert down.returncode == 0, down
        assert down.stdout.startswith(f"world down: torn down (pid {second.proc.pid}, "
                                      f"regions apac-se; since ")
        assert second.proc.wait(timeout=5) == 0  # down waited for it
        assert "SIGTERM: tearing the world down" in second.stderr()
        assert not (state_dir / "world.json").exists()
        assert leftovers(second.state, first.before) == NOTHING
    finally:
        if second.proc.poll() is None:
            second.proc.send_signal(signal.SIGINT)
            second.proc.wait(timeout=30)


KEEP = """name: keep
description: one short call, then the world stays up
clusters: [na-east]
sessions_per_region: 1
call_duration_s: 2
start_rate: 1
architectures: [cluster-relay]
last_mile: last_mile_broadband
calibration: {count: 100, rate: 100, at_load: false}
"""


def test_a_scenario_keeps_its_world_and_last_services_up(tmp_path):
    """scenario --keep-world: results and report written, then the world held with the last
    architecture's services running (recorded, so a reap would kill them), until Ctrl-C. The
    run also captures, with a 20 kB cap that the cluster's capture reaches during the call."""
    scenario, state_dir, results = tmp_path / "keep.yaml", tmp_path / "state", tmp_path / "out"
    scenario.write_text(KEEP)
    held = Up(state_dir, tmp_path, [sys.executable, "-m", "voiceedge", "scenario", str(scenario),
                                    "--region", "apac-se", "--results", str(results),
                                    "--keep-world", "--state-dir", str(state_dir),
                                    "--capture", "--capture-cap-mb", "0.02"])
    try:
        services = [r for r in held.state["extra_pids"] if r["what"] == "service"]
        assert len(services) >= 4 and all(same_process(r["pid"], r["start_ticks"])
                                          for r in services)  # agent, redis, relay, transceiver
        assert "cluster-relay's services still up: " in held.out and "relay-na-east@cluster2" \
            in held.out
        [run] = results.iterdir()
        assert (run / "report.html").exists() and (run / "sessions.csv").exists()
        assert "[cluster-relay] capture at cluster2 reached its cap of 0.02 MiB after " in \
            " ".join(held.stderr().split())
        captures = json.loads((run / "pcap" / "cluster-relay" / "captures.json").read_text())
        capped = [p for p in captures["points"] if p["capped_after_s"]]
        assert capped and all(p["bytes"] >= captures["cap_bytes"] for p in capped), capped
        [wire] = json.loads((run / "pcap" / "analysis.json").read_text())["architectures"]
        assert wire["cost"]["capped"] == [p["host"] for p in capped]
        assert wire["hops"] and all(h["ok"] for h in wire["hops"]), wire["hops"]
        bound = world("exec", state_dir, "cluster2", "--", "ss", "-uanH")
        assert ":3478 " in bound.stdout, bound  # the relay still holds its port
        held.proc.send_signal(signal.SIGINT)
        assert held.proc.wait(timeout=60) == 0, held.stderr()
        assert not [r for r in services if same_process(r["pid"], r["start_ticks"])]
        assert leftovers(held.state, held.before) == NOTHING
        assert "writing the report" not in held.stderr()  # once, before the hold: not again
    finally:
        if held.proc.poll() is None:  # a failure above: tear down as Ctrl-C would
            held.proc.send_signal(signal.SIGINT)
            try:
                held.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        held.kill()
