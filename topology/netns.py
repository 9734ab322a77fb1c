"""A one-host lab: a network namespace with a veth pair, for demos and tests on one machine.

WebRTC stacks skip loopback when gathering candidates (aioice does), and traffic must stay off
the machine's own interfaces, so single-host runs happen inside a namespace of their own: two
veth ends with addresses from ``10.77.0.0/24``, lo up, nothing routed outside. Code reaches it
by entering the namespace in a thread (``in_namespace``; sockets keep the namespace they were
made in) or by starting processes with ``ip netns exec``.
"""
from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass

from topology.impairment.nsutil import NamespaceError, in_netns
from topology.impairment.nsutil import setns


class NetnsError(NamespaceError):
    """A namespace could not be made or entered (not root, no iproute2)."""


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


@dataclass(frozen=True)
class LabNamespace:
    name: str
    addresses: tuple[str, ...] = ("10.77.0.1", "10.77.0.2")

    def exec_prefix(self) -> list[str]:
        """Prefix for a command that must run inside the namespace."""
        return ["ip", "netns", "exec", self.name]


class lab_namespace:
    """Context manager: create the lab namespace, delete it (and its veths) on exit."""

    def __init__(self, prefix: str = "velab") -> None:
        self.ns = LabNamespace(f"{prefix}-{os.getpid()}")

    def __enter__(self) -> LabNamespace:
        if os.geteuid() != 0:
            raise NetnsError("a lab namespace needs root")
        name = self.ns.name
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        _ip("netns", "add", name)
        try:
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "link", "add", "ve0", "type", "veth", "peer", "name", "ve1")
            for dev, addr in zip(("ve0", "ve1"), self.ns.addresses):
                _ip("-n", name, "addr", "add", f"{addr}/24", "dev", dev)
                _ip("-n", name, "link", "set", dev, "up")
        except NetnsError:
            self.__exit__(None, None, None)
            raise
        return self.ns

    def __exit__(self, *exc) -> None:
        # Deleting the namespace removes its veth pair too.
        subprocess.run(["ip", "netns", "delete", self.ns.name], capture_output=True)


def ns_path(name: str) -> str:
    """The namespace file for ``name``: a name under /var/run/netns, or already a path (such as
    a Mininet host's /proc/PID/ns/net)."""
    return name if name.startswith("/") else f"/var/run/netns/{name}"


def enter(name: str) -> None:
    """Move the calling thread into namespace ``name`` (for good: see ``entered``)."""
    fd = os.open(ns_path(name), os.O_RDONLY)
    try:
        setns(fd, name)
    finally:
        os.close(fd)


def entered(name: str) -> in_netns:
    """Context manager: the calling thread (and threads it starts meanwhile) works inside
    namespace ``name`` and returns to its own on exit."""
    return in_netns(ns_path(name))


def in_namespace(name: str, fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` in a thread inside namespace ``name``; return its result."""
    box: dict = {}

    def target() -> None:
        try:
            enter(name)
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"netns-{name}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")
