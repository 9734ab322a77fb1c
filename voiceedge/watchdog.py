"""The reaper's watchdog: a small process that cleans up after a command that died.

Started by voiceedge/reaper.py as ``python -I -S watchdog.py PID`` with a pipe on stdin, in a
session of its own (a Ctrl-C at the terminal or a signal to the command's process group does
not reach it) and with SIGINT, SIGTERM and SIGHUP ignored. The command writes one JSON object a
line on the pipe, for what it created and what it removed again::

    {"op": "add", "kind": "group", "pid": 812, "ticks": 90311}   a process group (its leader)
    {"op": "add", "kind": "process", "pid": 813, "ticks": 90312} one process alone
    {"op": "add", "kind": "netns", "name": "vehyg-811"}          a named network namespace
    {"op": "add", "kind": "dir", "path": "/tmp/voiceedge-hygiene-x"}  a temporary folder
    {"op": "drop", "kind": "process", "pid": 812}                 (and the same for the others)
                                                                 removed by the command
    {"op": "exit", "clean": true}                                the command is ending

When the pipe closes (the command exited, however it died: the kernel closes the pipe even
after SIGKILL), whatever is still recorded is removed: processes (SIGTERM, then SIGKILL after
3 s; a pid only if it is still the recorded process, by its start time), then namespaces (their
veths and iptables rules go with them), then temporary folders, which are kept only when the
command said it ended cleanly (a finished run's logs stay, an interrupted run's go). One line on
stderr says what was reaped.

Standard library only, nothing of the project: it starts in milliseconds and cannot break with
the code it cleans up after.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time


def stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state first), or None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot; field 22), or None if it is gone."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields else None


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(int(name))
            if fields is not None and int(fields[2]) == pgid:
                out.append(int(name))
    return out


def _ours(record: dict) -> list[int]:
    """The live processes of a record: a group's members (while its leader is the recorded
    process or gone: a process group id is not reused while the group has members), or the
    one process if it is still the recorded one."""
    pid, ticks = record["pid"], record.get("ticks")
    now = start_ticks(pid)
    if now is not None and now != ticks:
        return []  # a recycled pid: someone else's
    if record["kind"] == "group":
        return group_members(pid)
    return [pid] if now is not None else []


def _signal(record: dict, sig: int) -> bool:
    if not _ours(record):
        return False
    try:
        if record["kind"] == "group":
            os.killpg(record["pid"], sig)
        else:
            os.kill(record["pid"], sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def reap_processes(records: list[dict], grace: float = 3.0) -> tuple[int, list[int]]:
    """SIGTERM every recorded process (group), SIGKILL what is left after ``grace`` s.
    Returns (how many were signalled, pids still alive)."""
    signalled = [r for r in records if _signal(r, signal.SIGTERM)]
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_ours(r) for r in signalled):
        time.sleep(0.05)
    for r in signalled:
        _signal(r, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(_ours(r) for r in signalled):
        time.sleep(0.05)
    return len(signalled), [p for r in signalled for p in _ours(r)]


def _key(record: dict) -> tuple:
    if record["kind"] in ("group", "process"):
        return ("process", record["pid"])
    return (record["kind"], record.get("name"), record.get("path"))


def reap(records: list[dict], clean: bool) -> str | None:
    """Remove what ``records`` name (see the module's docstring); one line, or None when there
    was nothing to do."""
    procs = [r for r in records if r["kind"] in ("group", "process")]
    netns = [r["name"] for r in records if r["kind"] == "netns"]
    dirs = [] if clean else [r["path"] for r in records if r["kind"] == "dir"]
    killed, left = reap_processes(procs) if procs else (0, [])
    for name in netns:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    removed = [d for d in dirs if os.path.isdir(d)]
    for d in removed:
        shutil.rmtree(d, ignore_errors=True)
    if not (killed or netns or removed):
        return None
    line = (f"{killed} process group{'s' if killed != 1 else ''} stopped, {len(netns)} "
            f"namespace{'s' if len(netns) != 1 else ''} and {len(removed)} temporary "
            f"folder{'s' if len(removed) != 1 else ''} removed")
    if left:
        line += f"; still running: {', '.join(map(str, left))}"
    return line


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    parent = argv[1] if len(argv) > 1 else "?"
    records: dict[tuple, dict] = {}
    clean = False
    for raw in sys.stdin.buffer:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        op = msg.pop("op", None)
        if op == "add":
            records[_key(msg)] = msg
        elif op == "drop":
            records.pop(_key(msg), None)
        elif op == "exit":
            clean = bool(msg.get("clean"))
    line = reap(list(records.values()), clean)
    if line:
        try:
            print(f"voiceedge reaper: after pid {parent}: {line}", file=sys.stderr, flush=True)
        except OSError:  # the terminal is gone
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
