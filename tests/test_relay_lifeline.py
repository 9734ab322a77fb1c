"""A relay's workers die with it, and a relay never starts beside a survivor on its port."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from services.relay.lifeline import port_holders
from services.procfs import alive
from tests.conftest import REPO, free_port


def _relay_args(tmp_path, port: int) -> list[str]:
    routes = tmp_path / "routes.toml"
    routes.write_text('[routes]\n1 = "127.0.0.1:9"\n')
    return ["--tier", "ingress", "--routes", str(routes), "--listen", "127.0.0.1", "--port",
            str(port), "--hop-bind", "127.0.0.1", "--workers", "2"]


def _worker_pids(relay) -> list[int]:
    for line in relay.log().splitlines():
        record = json.loads(line)
        if record.get("event") == "relay_started":
            return record["worker_pids"]
    raise AssertionError("no relay_started line")


def test_workers_die_when_their_relay_is_killed_and_a_new_relay_gets_the_port(tmp_path,
                                                                             relay_factory):
    port = free_port()
    relay = relay_factory(_relay_args(tmp_path, port))
    workers = _worker_pids(relay)
    assert len(workers) == 2 and all(alive(pid) for pid in workers)
    assert {h.pid for h in port_holders([("127.0.0.1", port)])} == set(workers)
    relay.proc.kill()  # SIGKILL to the relay alone, as a crash or the OOM killer would
    relay.proc.wait()
    relay.proc = None
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in workers), "a worker outlived its relay"
    assert port_holders([("127.0.0.1", port)]) == []
    again = relay_factory(_relay_args(tmp_path, port))
    assert {h.pid for h in port_holders([("127.0.0.1", port)])} == set(_worker_pids(again))


def test_a_relay_refuses_to_share_its_port_with_a_stale_holder(tmp_path):
    port = free_port()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import socket, sys, time\n"
         "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
         "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
         f"s.bind(('0.0.0.0', {port}))\nprint('bound', flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "bound"
        proc = subprocess.run([sys.executable, "-m", "voiceedge", "relay",
                               *_relay_args(tmp_path, port), "--metrics", "none"],
                              capture_output=True, text=True, cwd=REPO, timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert "Traceback" not in proc.stderr
    assert f"UDP 0.0.0.0:{port} is already held by pid {holder.pid}" in line, line


def test_port_holders_match_wildcards_and_exclude_the_caller():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        me = os.getpid()
        assert [h.pid for h in port_holders([("127.0.0.1", port)])] == [me]
        assert [h.address for h in port_holders([("0.0.0.0", port)])] == [f"127.0.0.1:{port}"]
        assert port_holders([("127.0.0.2", port)]) == []  # another address, same port
        assert port_holders([("127.0.0.1", port)], exclude={me}) == []
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s6:
        s6.bind(("::1", 0))
        port6 = s6.getsockname()[1]
        assert [h.address for h in port_holders([("::", port6)])] == [f"[::1]:{port6}"]
