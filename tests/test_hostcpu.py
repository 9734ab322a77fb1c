"""Where the host's CPU went while the calls ran (scenarios/hostcpu.py), and its report table."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from analysis.load import load_results
from analysis.tables import host_cpu, to_markdown
from scenarios.hostcpu import HostCpu, HostCpuWatch, HostTimes, process_groups
from scenarios.saturation import LagWindows
from tests.test_analysis import write_run

BUSY = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"
PARENT = ("import subprocess, sys, time\n"
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
          "time.sleep(30)\n")


@pytest.fixture
def spawn():
    procs = []

    def start(code: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        procs.append(proc)
        return proc
    yield start
    for proc in procs:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait()


def test_host_times_read_proc_stat_fields(tmp_path):
    hz = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(f"cpu  {10 * hz} {hz} {4 * hz} {50 * hz} {2 * hz} {hz} {3 * hz} {5 * hz} 0 0\n"
                    "cpu0 1 2 3 4 5 6 7 8 0 0\n")
    t = HostTimes.read(str(stat), cpuidle=None)
    assert (t.idle, t.steal, t.irq) == (52.0, 5.0, 4.0)
    # cpuidle's microsecond counters, where there are some, in place of /proc/stat's idle
    for cpu, times in (("cpu0", (1_500_000, 20_000_000)), ("cpu1", (500_000, 10_000_000))):
        for n, us in enumerate(times):
            d = tmp_path / "sys" / cpu / "cpuidle" / f"state{n}"
            d.mkdir(parents=True)
            (d / "time").write_text(f"{us}\n")
    (tmp_path / "sys" / "cpufreq").mkdir()
    t = HostTimes.read(str(stat), cpuidle=str(tmp_path / "sys"))
    assert (t.idle, t.steal, t.irq) == (32.0 + 2.0, 5.0, 4.0)


def test_cpuidle_counts_the_idle_time_of_this_host_by_the_microsecond():
    from services.procfs import cpuidle_seconds
    first = cpuidle_seconds()
    if first is None:
        pytest.skip("no cpuidle on this kernel")
    started = time.monotonic()
    while (idle := cpuidle_seconds() - first) == 0 and time.monotonic() - started < 5:
        time.sleep(0.05)   # a busy host (make test's workers) may not idle for a while
    elapsed = time.monotonic() - started
    assert 0 < idle <= elapsed * os.cpu_count() + 0.05
    assert idle != round(idle, 2)   # microseconds, not 10 ms ticks


def test_groups_take_each_root_and_what_it_started(spawn):
    parent = spawn(PARENT)
    deadline = time.monotonic() + 10
    while True:
        groups = process_groups([("service", parent.pid), ("runner", os.getpid())])
        if len(groups.get("service", [])) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert groups["service"][0] == parent.pid and len(groups["service"]) == 2
    # the runner (this process) started the parent too, but a process counts in one group
    assert os.getpid() in groups["runner"]
    assert not set(groups["runner"]) & set(groups["service"])
    assert "gone" not in process_groups([("gone", 2 ** 22 + 1)])


def _started(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Until ``proc`` (a Python child) has finished starting: its CPU time stops growing. Its
    start-up (tens of ms of CPU, longer on a loaded host) is not what a measurement of it as
    an idle process is after."""
    def cpu() -> int:
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])   # utime + stime, in ticks
    deadline, last = time.monotonic() + timeout_s, -1
    while time.monotonic() < deadline:
        now = cpu()
        if now == last:
            return
        last = now
        time.sleep(0.1)


def test_a_busy_group_and_an_idle_one_measured_apart(spawn):
    busy, idle = spawn(BUSY), spawn("import time; time.sleep(30)")
    _started(idle)   # (under make test's three workers a late start-up measured 2.1%)
    watch = HostCpuWatch(lambda: {"busy": [busy.pid], "idle": [idle.pid]}, lambda: True,
                         every_s=0.1)
    assert watch.result() is None
    watch.open()
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        watch.sample()
        time.sleep(0.05)
    r = watch.result()
    assert r is not None and 1.3 < r.seconds < 3
    assert r.groups["busy"] > 40          # a spinning process, most of a core
    assert r.groups["idle"] < 2           # a sleeping one, next to nothing
    assert r.busy_pct >= r.groups["busy"] * 0.8   # the host saw it too (tick-sampled)
    assert r.busy_of_host_pct == pytest.approx(r.busy_pct / (os.cpu_count() or 1), abs=0.1)


def test_the_window_closes_at_the_last_reading_with_every_client_running():
    now = {"t": 100.0, "cpu": 1.0, "idle": 50.0}
    alive = {"all": True}
    watch = HostCpuWatch(lambda: {"clients": [1]}, lambda: alive["all"],
                         read_host=lambda: HostTimes(now["idle"], 0.5, 0.25),
                         read_cpu=lambda pid: now["cpu"], every_s=1.0,
                         clock=lambda: now["t"], cpus=2)
    watch.open()
    now.update(t=100.5, cpu=1.2)
    watch.sample()                        # not due yet: no reading
    now.update(t=104.0, cpu=2.0, idle=55.0)
    watch.sample()
    alive["all"] = False                  # a client ended: what follows is the tail
    now.update(t=110.0, cpu=9.0, idle=56.0)
    watch.sample()
    r = watch.result()
    assert r.seconds == 4.0 and r.cpus == 2
    assert r.groups == {"clients": 25.0}  # 1 s of CPU in 4 s
    assert r.busy_pct == 75.0             # 8 core-seconds, 5 of them idle
    assert r.other_pct == 50.0 and r.steal_pct == 0.0 and r.busy_of_host_pct == 37.5


def test_the_report_shows_where_the_cpu_went(tmp_path):
    run = write_run(tmp_path / "default-all-20260101-000000")
    (run / "host_cpu.json").write_text(json.dumps({"global-relay": {
        "seconds": 96.0, "cpus": 2, "busy_pct": 171.3, "steal_pct": 1.2, "irq_pct": 14.0,
        "groups": {"clients": 52.5, "engine": 31.0, "ingress": 20.2, "runner": 1.4},
        "other_pct": 66.2, "busy_of_host_pct": 85.7,
        "idle_probe": {"priority": 2, "seconds": 95, "lagged_seconds": 36}}}))
    table = to_markdown(host_cpu(load_results(run)))
    assert ("| global-relay | 96 | 86% (171 of 200) | 36 of 95 | 1.2 | 14.0 | 52.5 | 31.0 | 20.2 "
            "| 1.4 | 66.2 |") in table
    header = table.splitlines()[0]
    assert header.index("clients") < header.index("engine") < header.index("ingress")
    shutil.rmtree(run)


def test_the_idle_probe_is_counted_over_the_windows_whole_seconds():
    window = HostCpu(seconds=5.7, cpus=2, busy_pct=0, steal_pct=0, irq_pct=0,
                     start_unix=99.5, end_unix=105.2)
    assert window.whole_seconds() == (100, 105)
    lag = LagWindows()
    for second in (99, 100, 104, 105):
        lag.add("idle-probe", float(second), 1.0, 30.0)
    # whole seconds 100..104: 100 and 104 lagged; 99 and 105 are outside
    assert lag.covered(["idle-probe"], *window.whole_seconds()) == 2
