"""One run of an emulated world at a time on a host.

A run changes settings that are the host's, not its own, for its length: the idle cores'
polling (haltpoll.py) and the softirq threads' priority (priorities.py), each put back as it
found it. A second run started beside it finds the first run's settings, takes them for the
host's, and puts them back after the first has restored the real ones (seen: a guest left
polling 2 ms and its softirq threads at SCHED_FIFO); both also share two cores that each
assumed were theirs. So a run holds an exclusive lock on LOCK_PATH, and one started while it
is held stops before it changes anything, saying which process holds it.

    with HostLock():   # re-entrant on the same object: run() and run_in() both hold it
        ...

``VOICEEDGE_WORLD_LOCK`` names another lock file (the tests' own runs).
"""
from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path

from voiceedge.errors import UserError

LOCK_PATH = Path("/run/voiceedge/world.lock")
LOCK_ENV = "VOICEEDGE_WORLD_LOCK"


class HostBusy(UserError):
    """Another run of an emulated world holds this host."""


@dataclass
class HostLock:
    path: Path = field(default_factory=lambda: Path(os.environ.get(LOCK_ENV) or LOCK_PATH))
    _fd: int | None = None
    _depth: int = 0

    def __enter__(self) -> "HostLock":
        if self._depth == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise HostBusy(f"another run of an emulated world holds this host (pid "
                               f"{holder}, {self.path}): one at a time, since a run sets the "
                               "host's idle polling and softirq priority for its length") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._fd = fd
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)   # closing the last descriptor releases the lock
            self._fd = None
