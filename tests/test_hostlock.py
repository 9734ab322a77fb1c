"""One run of an emulated world at a time on a host (scenarios/hostlock.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from scenarios.hostlock import LOCK_ENV, HostBusy, HostLock
from tests.conftest import REPO

HOLD = ("import sys, time; from pathlib import Path; from scenarios.hostlock import HostLock\n"
        "with HostLock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n")


@pytest.fixture
def held(tmp_path):
    """The lock at a path of this test's, held by another process (its pid)."""
    path = tmp_path / "world.lock"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield path, proc.pid
    proc.kill()
    proc.wait()


def test_a_second_process_is_refused_and_told_who_holds_it(held):
    path, pid = held
    with pytest.raises(HostBusy, match=f"pid {pid}"):
        with HostLock(path):
            pass


def test_the_lock_is_reentrant_in_its_holder_and_free_after(tmp_path):
    lock = HostLock(tmp_path / "world.lock")
    with lock:
        with lock:                  # run() holds it, and run_in() inside it
            pass
        assert (tmp_path / "world.lock").read_text().strip() == str(os.getpid())
    with HostLock(tmp_path / "world.lock"):   # released: anyone may take it
        pass


@pytest.mark.netns  # the command's backend detection probes for netem in a namespace
def test_a_scenario_beside_a_running_one_stops_before_it_changes_anything(held, tmp_path):
    path, pid = held
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "scenario",
                           str(REPO / "scenarios" / "ci.yaml"), "--region", "apac-se",
                           "--results", str(out)], capture_output=True, text=True, cwd=REPO,
                          timeout=60, env={**os.environ, LOCK_ENV: str(path)})
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]   # after the run's own opening lines
    assert f"pid {pid}" in last and "Traceback" not in proc.stderr
    assert not out.exists()
