"""scenarios/ports.py: the UDP sockets of a process tree, read from /proc."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from scenarios.ports import process_sessions, udp_bindings
from services.procfs import decode_address

# A child that binds what it is told, forks a worker that binds one more, and waits.
CHILD = r"""
import os, socket, sys, time
keep = []
for spec in sys.argv[1:]:
    family, host, port = spec.split(",")
    s = socket.socket(socket.AF_INET6 if family == "6" else socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, int(port)))
    keep.append(s)
if os.fork() == 0:
    w = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    w.bind(("127.0.0.1", 0))
    os.write(1, f"worker {w.getsockname()[1]}\n".encode())  # one write: no interleaving
    time.sleep(30)
    os._exit(0)
os.write(1, b"ready\n")
time.sleep(30)
"""


@pytest.fixture
def child():
    procs = []

    def start(*specs: str) -> tuple[subprocess.Popen, int]:
        p = subprocess.Popen([sys.executable, "-c", CHILD, *specs], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
        procs.append(p)
        lines = sorted(p.stdout.readline().split() for _ in range(2))
        assert lines[0][0] == "ready" and lines[1][0] == "worker", lines
        return p, int(lines[1][1])

    yield start
    for p in procs:
        subprocess.run(["kill", "--", f"-{p.pid}"], capture_output=True)
        p.wait()


def test_decode_reads_the_kernels_little_endian_words():
    assert decode_address("0100007F:0D96") == ("127.0.0.1", 3478)
    assert decode_address("00000000000000000000000001000000:0035") == ("::1", 53)
    assert decode_address("0A0B000A:1F90") == ("10.0.11.10", 8080)


def test_bindings_of_a_process_tree_are_the_ones_it_bound(child):
    proc, worker_port = child("4,127.0.0.1,0", "4,127.0.0.2,0", "6,::1,0")
    got = {(b.address, b.pid == proc.pid) for b in udp_bindings(proc.pid)}
    assert got == {("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("127.0.0.1", False)}
    ports = {b.port for b in udp_bindings(proc.pid) if b.pid != proc.pid}
    assert ports == {worker_port}  # the forked worker's socket, found through the session


def test_a_process_outside_the_session_is_not_counted(child):
    a, _ = child("4,127.0.0.1,0")
    b, _ = child("4,127.0.0.1,0")
    pids_a = {x.pid for x in udp_bindings(a.pid)}
    pids_b = {x.pid for x in udp_bindings(b.pid)}
    assert pids_a and pids_b and not pids_a & pids_b


def test_one_pass_over_proc_serves_every_leader(child):
    """Edge.public_bindings reads the process sessions once for all its services: the same
    bindings per leader as a pass of its own, and each leader's only."""
    a, _ = child("4,127.0.0.1,0")
    b, _ = child("4,127.0.0.2,0", "6,::1,0")
    index = process_sessions()
    for leader in (a.pid, b.pid):
        assert sorted(udp_bindings(leader, index)) == sorted(udp_bindings(leader))
    assert {x.address for x in udp_bindings(b.pid, index)} == {"127.0.0.2", "::1", "127.0.0.1"}
    assert {x.address for x in udp_bindings(a.pid, index)} == {"127.0.0.1"}


def test_a_closed_socket_disappears(child):
    proc, _ = child("4,127.0.0.1,0")
    before = len(udp_bindings(proc.pid))
    subprocess.run(["kill", "--", f"-{proc.pid}"], capture_output=True)
    proc.wait()
    time.sleep(0.2)
    assert before == 2 and udp_bindings(proc.pid) == []
