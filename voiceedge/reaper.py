"""The backstop behind every command's own cleanup: what it started is removed when it dies.

A command's ``finally`` blocks and context managers stop its services, delete its namespaces
and folders, also on Ctrl-C, SIGTERM and SIGHUP (voiceedge/stopsignals.py). They cannot run
after SIGKILL, or when a second Ctrl-C interrupts them. So the code that creates something
records it here (``track_process`` for a service, with its process group,
``track_netns``, ``temp_dir`` or ``track_dir`` for a temporary folder) and says when it removed it again
(``untrack_*``); the records go to a watchdog process (voiceedge/watchdog.py) that outlives the
command and removes whatever is still recorded when the command's end closes its pipe.

The command line (voiceedge/cli.py) opens one ``Reaper`` per command with ``reaping()``; the
watchdog itself is started on the first record, so commands that start nothing never pay for
it. This is the one piece of process-wide state in the project, on purpose: a pid or a
namespace belongs to the process that made it, wherever in the code it was made. Outside
``reaping()`` (a library call, a test) the ``track_*`` functions do nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from voiceedge.watchdog import stat_fields

_WATCHDOG = Path(__file__).with_name("watchdog.py")


class Reaper:
    """The records of one command and the pipe to its watchdog."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._closed = False

    def send(self, msg: dict) -> None:
        """Send one record to the watchdog (started on the first one)."""
        line = (json.dumps(msg) + "\n").encode()
        with self._lock:
            if self._closed:
                return
            try:
                if self._proc is None:
                    self._proc = subprocess.Popen(
                        [sys.executable, "-I", "-S", str(_WATCHDOG), str(os.getpid())],
                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                        start_new_session=True)
                self._proc.stdin.write(line)
                self._proc.stdin.flush()
            except OSError:  # no watchdog: the command's own cleanup still runs
                pass

    def close(self, clean: bool) -> None:
        """The command is ending: ``clean`` keeps its recorded folders (a finished run's
        logs); the watchdog removes anything else still recorded once this process is gone."""
        with self._lock:
            if self._proc is None or self._closed:
                self._closed = True
                return
            self._closed = True
            try:
                self._proc.stdin.write((json.dumps({"op": "exit", "clean": clean}) + "\n")
                                       .encode())
                self._proc.stdin.flush()
            except OSError:
                pass
            # The pipe stays open until this process exits: the watchdog acts only then.


_current: Reaper | None = None


@contextmanager
def reaping():
    """Record what the command creates for the length of the block (main thread, once per
    process). The block's outcome decides the folders: kept after a normal end, removed after
    an interrupt or a crash."""
    global _current
    reaper = _current = Reaper()
    clean = False
    try:
        yield reaper
        clean = True
    except BaseException as exc:
        clean = not isinstance(exc, (KeyboardInterrupt, MemoryError))
        raise
    finally:
        reaper.close(clean)
        _current = None


def _send(op: str, kind: str, **fields) -> None:
    reaper = _current
    if reaper is not None:
        reaper.send({"op": op, "kind": kind, **fields})


def track_process(pid: int) -> None:
    """Process ``pid`` must not outlive us; its whole process group if it leads one (a
    service started with ``start_new_session``, with the workers it forks)."""
    fields = stat_fields(pid)
    if fields is not None:
        kind = "group" if int(fields[2]) == pid else "process"
        _send("add", kind, pid=pid, ticks=int(fields[19]))


def untrack_process(pid: int) -> None:
    """Process ``pid`` (and its group) is gone, stopped by the code that started it."""
    _send("drop", "process", pid=pid)


def track_netns(name: str) -> None:
    """The named network namespace ``name`` (under /var/run/netns) must not outlive us."""
    _send("add", "netns", name=name)


def untrack_netns(name: str) -> None:
    _send("drop", "netns", name=name)


def track_dir(path: os.PathLike | str) -> None:
    """A temporary folder this command made: removed if the command is interrupted."""
    _send("add", "dir", path=str(Path(path).resolve()))


def untrack_dir(path: os.PathLike | str) -> None:
    _send("drop", "dir", path=str(Path(path).resolve()))


def temp_dir(prefix: str) -> Path:
    """``tempfile.mkdtemp(prefix=prefix)``, tracked: kept when the command ends normally (its
    logs), removed when it is interrupted or killed."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    track_dir(path)
    return path
