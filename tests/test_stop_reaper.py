"""The stop mechanism alone, on loopback: SIGTERM and SIGHUP unwind as Ctrl-C does
(voiceedge/stopsignals.py), and the watchdog removes what a SIGKILLed process recorded
(voiceedge/reaper.py). Each case is a small Python child; tests/test_stop_commands.py kills
the real commands."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO


def _as_from_a_terminal() -> None:
    """The signal state a command started from a shell's prompt has: nothing blocked, SIGINT
    and SIGTERM at their defaults (a pytest worker may have inherited or set otherwise)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def child(code: str, tmp_path: Path) -> subprocess.Popen:
    """A Python child running ``code``, read until it prints ``ready``."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_from_a_terminal)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        pytest.fail(f"the child did not start: {line}{proc.stderr.read()}")
    return proc


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# A command's shape: asyncio.run (as most commands run), cleanup in a finally block.
ASYNC_CHILD = """
    import asyncio, sys
    from pathlib import Path
    from voiceedge.stopsignals import stop_signals

    async def main():
        try:
            print("ready", flush=True)
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.2)  # an orderly, awaited teardown
            Path(sys.argv[1], "cleaned").write_text("yes")

    with stop_signals() as stops:
        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            sys.exit(stops.status())
"""


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                         (signal.SIGINT, 130)])
def test_a_stop_signal_unwinds_as_ctrl_c(tmp_path, sig, status):
    """Without stop_signals, SIGTERM and SIGHUP kill Python on the spot: no finally runs."""
    proc = child(ASYNC_CHILD, tmp_path)
    proc.send_signal(sig)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # once in make check: say what the child's signals were
        masks = [line for line in open(f"/proc/{proc.pid}/status") if line.startswith("Sig")]
        proc.kill()
        pytest.fail(f"the child ignored {sig!r} for 10 s: {''.join(masks)}")
    assert proc.returncode == status, proc.stderr.read()
    assert (tmp_path / "cleaned").read_text() == "yes"


def test_a_second_sigterm_does_not_cut_the_teardown_short(tmp_path):
    proc = child(ASYNC_CHILD.replace("asyncio.sleep(0.2)", "asyncio.sleep(1.0)"), tmp_path)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.4)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert proc.returncode == 143, proc.stderr.read()
    assert (tmp_path / "cleaned").read_text() == "yes"


# A command that is SIGKILLed with a service, a worker of it and a temporary folder running.
KILLED_CHILD = """
    import sys, time
    from pathlib import Path
    from scenarios.processes import ServiceProcess
    from voiceedge.reaper import reaping, temp_dir

    with reaping():
        folder = temp_dir("voiceedge-reaper-test-")
        here = Path(sys.argv[1])
        service = ServiceProcess("sleeper", ["sh", "-c", f"sleep 300 & echo $! > {here}/worker; "
                                             "wait"], here / "sleeper.log").start()
        Path(sys.argv[1], "pids").write_text(f"{service.pid} {folder}")
        time.sleep(0.5)
        print("ready", flush=True)
        time.sleep(60)
"""


def test_the_watchdog_reaps_what_a_killed_command_left(tmp_path):
    proc = child(KILLED_CHILD, tmp_path)
    pid, folder = (tmp_path / "pids").read_text().split()
    assert Path(folder).is_dir()
    worker = int((tmp_path / "worker").read_text())
    proc.kill()  # no finally, no handler: only the watchdog can clean up
    proc.wait()
    try:
        assert wait_until(lambda: gone(int(pid))), "the service outlived its command"
        assert wait_until(lambda: gone(worker)), "the service's worker outlived it"
        assert wait_until(lambda: not Path(folder).exists()), "the temporary folder stayed"
        err = proc.stderr.read()
        assert "voiceedge reaper: after pid" in err and "1 process group stopped" in err, err
    finally:
        if not gone(int(pid)):
            os.killpg(int(pid), signal.SIGKILL)


def test_what_was_cleaned_up_is_not_touched(tmp_path):
    """A service stopped by its command is dropped from the records; a folder of a command
    that ended normally is kept (its logs)."""
    code = KILLED_CHILD.replace('print("ready", flush=True)\n        time.sleep(60)',
                                'service.stop()\n        print("ready", flush=True)')
    proc = child(code, tmp_path)
    _, folder = (tmp_path / "pids").read_text().split()
    proc.wait(timeout=10)
    assert proc.returncode == 0
    time.sleep(0.5)  # the watchdog has had its chance
    assert Path(folder).is_dir()
    assert "voiceedge reaper" not in proc.stderr.read()
    Path(folder).rmdir()
