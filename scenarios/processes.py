"""Services as child processes: start, wait until ready, stop, always clean up.

Used by demos and scenarios to run the real services (redis-server, relays, transceivers, the
agent, signaling), optionally inside a network namespace (``ip netns exec``).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from voiceedge import reaper


class ServiceError(RuntimeError):
    """A service that did not start; the message carries the tail of its log."""


def voiceedge_cmd(*args: str) -> list[str]:
    """The command line of a ``voiceedge`` subcommand with this interpreter."""
    return [sys.executable, "-m", "voiceedge", *args]


def redis_cmd(host: str, port: int, workdir: Path) -> list[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise ServiceError("redis-server is not installed (make installs it)")
    return [binary, "--port", str(port), "--bind", host, "--save", "", "--appendonly", "no",
            "--dir", str(workdir)]


class ServiceProcess:
    """One child process: its log (stderr) in ``log_path``, anything it prints on stdout (a
    client's summary) beside it in ``<name>.out``, so the log stays one JSON object a line."""

    def __init__(self, name: str, cmd: list[str], log_path: Path,
                 netns: str | None = None, realtime: int = 0) -> None:
        """``netns``: a name under /var/run/netns, or a namespace file path (a Mininet host's
        /proc/PID/ns/net). ``realtime``: run it (and every thread and child it starts) at this
        SCHED_FIFO priority; 0: ordinary (scenarios/priorities.py)."""
        self.name = name
        if netns is None:
            prefix = []
        elif netns.startswith("/"):
            prefix = ["nsenter", f"--net={netns}"]
        else:
            prefix = ["ip", "netns", "exec", netns]
        if realtime:
            prefix = ["chrt", "--fifo", str(realtime)] + prefix
        self.cmd = prefix + cmd
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._dead_groups: list[int] = []  # groups of killed main processes (stop reaps them)

    def start(self) -> "ServiceProcess":
        with open(self.log_path, "ab") as log, open(self.log_path.with_suffix(".out"), "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        reaper.track_process(self.proc.pid)  # reaped with its group if we die first
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, check, timeout: float = 15.0) -> "ServiceProcess":
        """Poll ``check()`` (True when ready) until it holds, the process dies, or timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServiceError(f"{self.name} exited:\n{self.log_tail()}")
            try:
                if check():
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise ServiceError(f"{self.name} not ready after {timeout:g} s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the whole process group (a crash: nothing flushed)."""
        if self.proc is not None:
            _signal_group(self.proc, signal.SIGKILL)
            self.proc.wait()
            reaper.untrack_process(self.proc.pid)
            self.proc = None
            self._drop_empty_out()

    def kill_main(self) -> None:
        """SIGKILL the main process alone, as a crash or the OOM killer would: its children
        are not signalled (they must notice on their own). Waits for the main process."""
        if self.proc is not None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
            self.proc.wait()
            self._dead_groups.append(self.proc.pid)
            self.proc = None
            self._drop_empty_out()

    def _drop_empty_out(self) -> None:
        out = self.log_path.with_suffix(".out")
        if out.exists() and out.stat().st_size == 0:
            out.unlink()

    def stop(self, timeout: float = 5.0) -> None:
        for pgid in self._dead_groups:  # anything a killed main process left behind
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            reaper.untrack_process(pgid)
        self._dead_groups.clear()
        if self.proc is None:
            return
        _signal_group(self.proc, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc, signal.SIGKILL)
            self.proc.wait()
        reaper.untrack_process(self.proc.pid)
        self.proc = None
        self._drop_empty_out()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=1) as r:
        return r.status == 200


def tcp_open(host: str, port: int) -> bool:
    with socket.create_connection((host, port), timeout=0.5):
        return True
