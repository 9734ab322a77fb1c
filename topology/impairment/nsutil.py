"""Network namespaces for one thread at a time: ``setns`` through ctypes (Python 3.11 has no
``os.setns``) and small helpers to make and remove named namespaces.

A socket keeps the namespace it was created in, so code enters a namespace, creates its
sockets and returns; the sockets may then be used from any thread.
"""
from __future__ import annotations

import ctypes
import os
import subprocess

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NamespaceError(RuntimeError):
    """A namespace could not be made, entered or left."""


def setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NamespaceError(f"setns {what}: {os.strerror(err)}")


class in_netns:
    """Context manager: the calling thread works in the namespace at ``ns_path``
    (``/proc/<pid>/ns/net`` or ``/var/run/netns/<name>``) and returns to its own on exit."""

    def __init__(self, ns_path: str) -> None:
        self.ns_path = ns_path
        self._home: int | None = None

    def __enter__(self) -> "in_netns":
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            fd = os.open(self.ns_path, os.O_RDONLY)
        except OSError as exc:
            os.close(self._home)
            raise NamespaceError(f"cannot open {self.ns_path}: {exc.strerror}") from None
        try:
            setns(fd, self.ns_path)
        except NamespaceError:
            os.close(self._home)
            raise
        finally:
            os.close(fd)
        return self

    def __exit__(self, *exc) -> None:
        try:
            # A thread left in a foreign namespace would poison everything it does later.
            setns(self._home, "back home")
        finally:
            os.close(self._home)


def add_netns(name: str) -> str:
    """Create the named namespace with ``lo`` up; return its path."""
    for cmd in (["ip", "netns", "add", name], ["ip", "-n", name, "link", "set", "lo", "up"]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            delete_netns(name)
            raise NamespaceError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return f"/var/run/netns/{name}"


def delete_netns(name: str) -> None:
    """Delete the named namespace (and the veths inside it); no error if it is gone."""
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)
