"""services/relay/scheduling.py: the workers' CPU and real-time priority, on a live relay."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from services.procfs import descendants
from services.relay import scheduling
from voiceedge.errors import ConfigError

from .conftest import REPO, free_port, needs


@pytest.mark.parametrize("text, cpus", [("0", {0}), ("0-1", {0, 1}), ("0,2-3,7", {0, 2, 3, 7})])
def test_online_cpus_reads_the_kernels_list(tmp_path, monkeypatch, text, cpus):
    online = tmp_path / "online"
    online.write_text(text + "\n")
    monkeypatch.setattr(scheduling, "_ONLINE", str(online))
    assert scheduling.online_cpus() == cpus


@needs("root")
def test_the_realtime_check_tries_and_undoes_it():
    before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    scheduling.check_realtime(10)
    assert (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) == before
    with pytest.raises(ConfigError, match="not a real-time priority"):
        scheduling.check_realtime(0)


def test_realtime_without_the_right_is_one_clear_line(as_nobody):
    with tempfile.TemporaryDirectory(dir="/tmp") as where:  # pytest's tmp_path is root's only
        os.chmod(where, 0o755)
        routes = Path(where) / "routes.toml"
        routes.write_text('[routes]\n1 = "127.0.0.1:9"\n')
        routes.chmod(0o644)
        proc = subprocess.run([*as_nobody, sys.executable, "-m", "voiceedge", "relay", "--tier",
                               "ingress", "--routes", str(routes), "--realtime", "10"],
                              capture_output=True, text=True, cwd=REPO, timeout=30)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--realtime 10 needs root or CAP_SYS_NICE" in proc.stderr, proc.stderr


@needs("root")
def test_the_worker_runs_on_its_cpu_at_realtime_priority_the_relay_does_not(
        tmp_path, relay_factory):
    """Started the way the flood bench starts it: from a process kept off the relay's CPU
    (the relay inherits that narrower set; --cpus names the host's CPU, not the parent's)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    routes = tmp_path / "routes.toml"
    routes.write_text('[routes]\n1 = "127.0.0.1:9"\n')
    mine = os.sched_getaffinity(0)  # this thread's
    try:
        os.sched_setaffinity(0, set(cpus[:-1]))  # inherited by the relay started below
        relay = relay_factory(["--tier", "ingress", "--routes", str(routes), "--listen",
                               "127.0.0.1", "--port", str(free_port()), "--hop-bind", "127.0.0.1",
                               "--cpus", str(cpus[-1]), "--realtime", "7"])
    finally:
        os.sched_setaffinity(0, mine)
    parent, *workers = descendants(relay.proc.pid)
    assert len(workers) == 1
    worker = workers[0]
    for tid in map(int, os.listdir(f"/proc/{worker}/task")):  # its threads inherit both
        assert os.sched_getaffinity(tid) == {cpus[-1]}
        assert os.sched_getscheduler(tid) == os.SCHED_FIFO
        assert os.sched_getparam(tid).sched_priority == 7
    assert os.sched_getscheduler(parent) == os.SCHED_OTHER
    assert os.sched_getaffinity(parent) == set(cpus[:-1])
    assert '"realtime": 7' in relay.log()
