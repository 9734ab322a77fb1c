"""Network namespaces: enter one from a thread, make and remove named ones, and the one-host lab.

``setns`` goes through ctypes (Python 3.11 has no ``os.setns``) and moves only the calling
thread. A socket keeps the namespace it was created in, so code enters a namespace, creates its
sockets and returns; the sockets may then be used from any thread. A namespace is named by a
name under /var/run/netns or by a namespace file path (a Mininet host's /proc/PID/ns/net).

The lab (``lab_namespace``) is for demos and tests on one machine: WebRTC stacks skip loopback
when gathering candidates (aioice does), and traffic must stay off the machine's own
interfaces, so single-host runs happen inside a namespace of their own: two veth ends with
addresses from ``10.77.0.0/24``, lo up, nothing routed outside. Code reaches it in a thread
(``in_namespace``, ``entered``) or starts processes with ``LabNamespace.exec_prefix()``.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
import threading
from dataclasses import dataclass

from voiceedge import reaper

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(RuntimeError):
    """A namespace could not be made, entered or left (not root, no iproute2, gone)."""


# The test suite's guard (tests/conftest.py, docs/contributing.md): for a test marked neither
# ``world`` nor ``netns`` it sets FORBIDDEN_ENV to a sentence naming the test and the marker to
# add. Every creator of namespaces in the project (add_netns, so the lab; topology.world.World,
# so Mininet; the netem probe) then refuses, in the test's process and in every process it
# starts; each refusal is also appended to the file named by FORBIDDEN_LOG_ENV, so that the
# test fails even where the error is swallowed or happens in a child process.
FORBIDDEN_ENV = "VOICEEDGE_NETNS_FORBIDDEN"
FORBIDDEN_LOG_ENV = "VOICEEDGE_NETNS_FORBIDDEN_LOG"


def refuse_if_forbidden(what: str) -> None:
    """Raise NetnsError before making ``what`` (e.g. "network namespace x") when the
    environment forbids namespaces (FORBIDDEN_ENV); nothing when it does not."""
    reason = os.environ.get(FORBIDDEN_ENV)
    if not reason:
        return
    log = os.environ.get(FORBIDDEN_LOG_ENV)
    if log:
        with open(log, "a") as f:
            f.write(f"{what} (pid {os.getpid()})\n")
    raise NetnsError(f"{what} refused: {reason}")


def ns_path(name: str) -> str:
    """The namespace file for ``name``: a name under /var/run/netns, or already a path."""
    return name if name.startswith("/") else f"/var/run/netns/{name}"


def setns(fd: int, what: str) -> None:
    """Move the calling thread into the network namespace open at ``fd``."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise NetnsError(f"setns {what}: {os.strerror(ctypes.get_errno())}")


def _open(name: str) -> int:
    try:
        return os.open(ns_path(name), os.O_RDONLY)
    except OSError as exc:
        raise NetnsError(f"cannot open namespace {ns_path(name)}: {exc.strerror}") from None


class entered:
    """Context manager: the calling thread (and threads it starts meanwhile) works inside
    namespace ``name`` and returns to its own on exit."""

    def __init__(self, name: str) -> None:
        self.path = ns_path(name)
        self._home: int | None = None

    def __enter__(self) -> "entered":
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            fd = _open(self.path)
            try:
                setns(fd, self.path)
            finally:
                os.close(fd)
        except BaseException:
            os.close(self._home)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            # A thread left in a foreign namespace would poison everything it does later.
            setns(self._home, "back home")
        finally:
            os.close(self._home)


def in_namespace(name: str, fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` in a new thread inside namespace ``name``; return its result
    (or raise its exception) in the caller's thread.

    An interrupt of the caller (Ctrl-C, or SIGTERM turned into one: voiceedge/stopsignals.py)
    does not leave the thread running on its own: for ``in_namespace(name, asyncio.run,
    coro)`` the coroutine is cancelled, as ``asyncio.run`` does on Ctrl-C in the main thread,
    so its ``finally`` blocks stop what it started; any other ``fn`` is waited for. Then the
    interrupt is raised again (a second one while waiting is raised at once)."""
    box: dict = {}
    started = threading.Event()
    if fn is asyncio.run and args and asyncio.iscoroutine(args[0]):
        coro, args = args[0], args[1:]

        async def cancellable():
            box["loop"], box["task"] = asyncio.get_running_loop(), asyncio.current_task()
            started.set()
            return await coro

        args = (cancellable(), *args)

    def target() -> None:
        try:
            fd = _open(name)
            try:
                setns(fd, name)  # for good: the thread ends with fn
            finally:
                os.close(fd)
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=target, name=f"netns-{os.path.basename(name)}")
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        started.wait()
        if "task" in box:
            try:
                box["loop"].call_soon_threadsafe(box["task"].cancel)
            except RuntimeError:  # its loop is already closed
                pass
        thread.join()  # its cleanup (a second Ctrl-C leaves the rest to the reaper)
        raise
    if "error" in box:
        raise box["error"]
    return box.get("result")


def ip(*args: str) -> None:
    """Run ``ip ARGS``; NetnsError with ip's own message when it fails."""
    try:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise NetnsError("ip is not installed (Debian package iproute2)") from None
    if proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def add_netns(name: str) -> str:
    """Create the named namespace with ``lo`` up; return its path."""
    refuse_if_forbidden(f"network namespace {name}")
    try:
        ip("netns", "add", name)
        reaper.track_netns(name)  # deleted by the reaper if we die first
        ip("-n", name, "link", "set", "lo", "up")
    except NetnsError:
        delete_netns(name)
        raise
    return ns_path(name)


def delete_netns(name: str) -> None:
    """Delete the named namespace (and the veths inside it); no error if it is gone."""
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    reaper.untrack_netns(name)


@dataclass(frozen=True)
class LabNamespace:
    name: str
    addresses: tuple[str, ...] = ("10.77.0.1", "10.77.0.2")

    def exec_prefix(self) -> list[str]:
        """Prefix for a command that must run inside the namespace."""
        return ["ip", "netns", "exec", self.name]


class lab_namespace:
    """Context manager: create the lab namespace (``PREFIX-PID``), delete it and its veths on
    exit."""

    def __init__(self, prefix: str = "velab") -> None:
        self.ns = LabNamespace(f"{prefix}-{os.getpid()}")

    def __enter__(self) -> LabNamespace:
        refuse_if_forbidden(f"lab namespace {self.ns.name}")
        if os.geteuid() != 0:
            raise NetnsError("a lab namespace needs root")
        name = self.ns.name
        delete_netns(name)  # a leftover of a killed run of this pid
        add_netns(name)
        try:
            ip("-n", name, "link", "add", "ve0", "type", "veth", "peer", "name", "ve1")
            for dev, addr in zip(("ve0", "ve1"), self.ns.addresses):
                ip("-n", name, "addr", "add", f"{addr}/24", "dev", dev)
                ip("-n", name, "link", "set", dev, "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.ns

    def __exit__(self, *exc) -> None:
        delete_netns(self.ns.name)  # removes its veth pair too
