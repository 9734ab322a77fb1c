"""relay-conntrack (deploy/compose/conntrack_guard.py) against a real conntrack table.

The guard runs as compose runs it (the script, its command line, a child process) but inside a
lab network namespace of the test's own, whose conntrack table the test fills with real
entries by sending UDP through real iptables rules, Docker's way: a standing MASQUERADE rule
(which keeps conntrack on in the namespace, as Docker's does on a host) and, in a chain
``DOCKER``, the DNAT of the published address:port to the "relay" that exists only while the
relay runs. Datagrams sent while that rule is absent make the entries the guard is for: not
NATed, unanswered. Nothing of conntrack is mocked; the assertions read ``conntrack -L``.

Addresses, all local to the namespace: the published one 10.77.0.1 (--public-host), the relay
10.77.0.2 (--relay-ip; also where the "clients" send from), and 10.77.0.3, a NAT target other
than the relay. Needs root, iptables and conntrack (``make deps``); the namespace, and with it
its rules and entries, is deleted afterwards.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, lab_fixture
from topology.netns import in_namespace

pytestmark = [pytest.mark.netns, pytest.mark.shareable]

GUARD = REPO / "deploy" / "compose" / "conntrack_guard.py"
PUBLIC, RELAY, OTHER, CLIENT = "10.77.0.1", "10.77.0.2", "10.77.0.3", "10.77.0.2"
PORT, RELAY_PORT, OTHER_PORT = 3478, 3479, 3490
DNAT = ["-d", f"{PUBLIC}/32", "-p", "udp", "--dport", str(PORT),
        "-j", "DNAT", "--to-destination", f"{RELAY}:{RELAY_PORT}"]

lab = lab_fixture("vect")


@pytest.fixture(scope="module")
def ns(lab):
    for tool in ("conntrack", "iptables"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: run `make deps`, which installs it")
    run(lab, "ip", "addr", "add", f"{OTHER}/24", "dev", "ve1")
    # Docker's standing MASQUERADE: with a NAT rule in the namespace, conntrack tracks every
    # flow (without one, iptables-nft registers no conntrack hooks and nothing is tracked).
    run(lab, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "10.99.0.0/24", "-j", "MASQUERADE")
    run(lab, "iptables", "-t", "nat", "-N", "DOCKER")
    run(lab, "iptables", "-t", "nat", "-A", "OUTPUT", "-j", "DOCKER")
    return lab


def run(lab, *cmd: str) -> str:
    proc = subprocess.run([*lab.exec_prefix(), *cmd], capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stderr.strip()}"
    return proc.stdout


def send(lab, sport: int, dst: str, dport: int) -> None:
    """One datagram from CLIENT:sport to dst:dport, sent inside the namespace."""
    def go() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((CLIENT, sport))
            s.sendto(b"rtp", (dst, dport))
    in_namespace(lab.name, go)


ENTRY = re.compile(r"^udp\s.*?src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+) .*?src=(\S+) dst=\S+ "
                   r"sport=(\d+) ")


def table(lab) -> dict[int, tuple[str, int, str, int]]:
    """The namespace's IPv4 UDP entries from CLIENT, by client port: (original destination,
    its port, the reply's source, its port). Each flow of the test has a port of its own."""
    out = run(lab, "conntrack", "-L", "-f", "ipv4", "-p", "udp")
    entries = {}
    for line in out.splitlines():
        m = ENTRY.match(line)
        assert m, f"unexpected conntrack line: {line}"
        src, dst, sport, dport, rsrc, rsport = m.groups()
        if src == CLIENT:
            entries[int(sport)] = (dst, int(dport), rsrc, int(rsport))
    return entries


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class GuardProcess:
    """The guard with compose's command line (docker-compose.yml, relay-conntrack), started in
    the namespace; its log (stderr) in a file."""

    def __init__(self, lab, log: Path, *extra: str, prefix: tuple[str, ...] = ()) -> None:
        self.log_path = log
        self.cmd = [*lab.exec_prefix(), *prefix, sys.executable, str(GUARD),
                    "--port", str(PORT), "--public-host", PUBLIC, "--relay-ip", RELAY,
                    "--interval", "0.2", *extra]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "GuardProcess":
        with open(self.log_path, "wb") as log:
            # `ip netns exec` execs the command: this pid is the guard's own, and its process
            # group (a session of its own) holds its `conntrack -E` too.
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=log,
                                         cwd=REPO, start_new_session=True)
        return self

    def __exit__(self, *exc) -> None:
        """Whatever happened, nothing of it stays: the guard and its `conntrack -E`."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(5)

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_log(self, text: str, count: int = 1, timeout: float = 5.0) -> None:
        def seen() -> bool:
            code = self.proc.poll()
            assert code is None, f"the guard exited {code}:\n{self.log()}"
            return self.log().count(text) >= count
        wait_until(seen, timeout, f"{text!r} x{count} in the guard's log:\n{self.log()}")


def namespace_pids(lab) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", lab.name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def test_it_deletes_only_the_unnated_entries_to_the_published_port(ns, tmp_path):
    run(ns, "iptables", "-t", "nat", "-F", "DOCKER")
    run(ns, "conntrack", "-F")
    # The relay is down (no DNAT in DOCKER): two calls' datagrams reach the published port and
    # make un-NATed entries; so do datagrams to another port and to another local address.
    unnated = (40002, 40012)
    for sport in unnated:
        send(ns, sport, PUBLIC, PORT)
    send(ns, 40003, PUBLIC, PORT + 5)       # another port of the published address
    send(ns, 40004, RELAY, PORT)            # the port, but on another local address
    # The relay is back: its DNAT, and a call whose entry it NATs; and a flow NATed elsewhere.
    run(ns, "iptables", "-t", "nat", "-I", "DOCKER", "-p", "udp", "--sport", "40011",
        "-d", f"{PUBLIC}/32", "--dport", str(PORT),
        "-j", "DNAT", "--to-destination", f"{OTHER}:{OTHER_PORT}")
    # ... and one NATed to another port of the published address itself (a REDIRECT's kind):
    # its reply comes from that address, but not from the published port.
    run(ns, "iptables", "-t", "nat", "-I", "DOCKER", "-p", "udp", "--sport", "40013",
        "-d", f"{PUBLIC}/32", "--dport", str(PORT),
        "-j", "DNAT", "--to-destination", f"{PUBLIC}:{OTHER_PORT}")
    run(ns, "iptables", "-t", "nat", "-A", "DOCKER", *DNAT)
    send(ns, 40001, PUBLIC, PORT)
    send(ns, 40011, PUBLIC, PORT)
    send(ns, 40013, PUBLIC, PORT)

    kept = {40001: (PUBLIC, PORT, RELAY, RELAY_PORT),       # NATed to the relay
            40011: (PUBLIC, PORT, OTHER, OTHER_PORT),       # NATed to something else
            40013: (PUBLIC, PORT, PUBLIC, OTHER_PORT),      # NATed to another local port
            40003: (PUBLIC, PORT + 5, PUBLIC, PORT + 5),    # not NATed, another port
            40004: (RELAY, PORT, RELAY, PORT)}              # not NATed, another address
    before = table(ns)
    assert before == {**kept, **{s: (PUBLIC, PORT, PUBLIC, PORT) for s in unnated}}, before

    with GuardProcess(ns, tmp_path / "guard.log", "--sweep", "60") as guard:
        # Its first listing finds the un-NATed entries, deletes them, lists again: clear.
        guard.wait_log("clear after")
        assert table(ns) == kept
        assert "un-NATed entries to 10.77.0.1:3478" in guard.log()
        assert "40002 (reply from 10.77.0.1)" in guard.log()

        # The relay goes down again (its DNAT is gone): a call's next datagram makes an
        # un-NATed entry, and conntrack's NEW event wakes the guard (its sweep is 60 s away).
        run(ns, "iptables", "-t", "nat", "-D", "DOCKER", *DNAT)
        send(ns, 40005, PUBLIC, PORT)
        guard.wait_log("clear after", count=2, timeout=3)
        assert table(ns) == kept
        # The relay is back: the call's next datagram gets an entry NATed to it, left alone.
        run(ns, "iptables", "-t", "nat", "-A", "DOCKER", *DNAT)
        send(ns, 40005, PUBLIC, PORT)
        time.sleep(0.5)
        assert table(ns) == {**kept, 40005: (PUBLIC, PORT, RELAY, RELAY_PORT)}

        events = [p for p in namespace_pids(ns) if cmdline(p)[1:2] == ["-E"]]
        assert len(events) == 1, "one `conntrack -E` watches the port"
        start = time.monotonic()
        guard.proc.send_signal(signal.SIGTERM)
        assert guard.proc.wait(5) == 0, guard.log()
        assert time.monotonic() - start < 1.0
        assert namespace_pids(ns) == [], "the guard left its `conntrack -E` behind"
    assert "stopped: " in guard.log() and "3 entries deleted" in guard.log(), guard.log()
    assert " ERROR " not in guard.log() and "Traceback" not in guard.log(), guard.log()


def test_it_exits_1_when_its_conntrack_events_end(ns, tmp_path):
    with GuardProcess(ns, tmp_path / "guard.log") as guard:
        guard.wait_log("watching UDP to 10.77.0.1:3478")
        [events] = [p for p in namespace_pids(ns) if p != guard.proc.pid]
        assert "-E" in cmdline(events)
        os.kill(events, signal.SIGKILL)
        assert guard.proc.wait(5) == 1
        assert namespace_pids(ns) == []
    errors = [line for line in guard.log().splitlines() if " ERROR " in line]
    assert len(errors) == 1 and errors[0].endswith("conntrack -E ended (exit -9)"), guard.log()


def test_without_net_admin_it_exits_1_with_one_error_line(ns, tmp_path):
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    # Root without CAP_NET_ADMIN: gone from the bounding set, so from every process it execs.
    drop = ("setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin")
    with GuardProcess(ns, tmp_path / "guard.log", prefix=drop) as guard:
        assert guard.proc.wait(10) == 1, guard.log()
        assert namespace_pids(ns) == [], "the guard left its `conntrack -E` behind"
    log = guard.log()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1, log
    assert "cannot read the conntrack table: conntrack -L: exit 1: " in errors[0], log
    assert "CAP_NET_ADMIN" in errors[0] or "not permitted" in errors[0], log
    assert "Traceback" not in log and "watching" not in log, log
