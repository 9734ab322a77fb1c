"""One interface, two backends: netem where the kernel has it, the userspace NFQUEUE engine
where it does not. ``make_backend(None)`` picks one by asking the kernel (``detect``).

Lifecycle: ``apply`` what each direction should suffer (before or after ``start``), ``start``,
read ``stats`` while traffic runs, ``stop``. ``stop`` removes everything the backend added
and is safe to call twice or after a failure; the context manager does start/stop.
"""
from __future__ import annotations

import logging
import os
import subprocess
from abc import ABC, abstractmethod

from topology.impairment.model import Impairment, NetNode

log = logging.getLogger("voiceedge.impairment")

BACKENDS = ("netem", "userspace")


class ImpairmentError(RuntimeError):
    """The backend could not impair as asked (a missing qdisc, a busy queue, a dead engine)."""


class BackendUnavailable(ImpairmentError):
    """The requested backend cannot run on this kernel."""


class ImpairmentBackend(ABC):
    """Impairs packets RECEIVED on an interface inside a node's namespace."""

    name: str

    @abstractmethod
    def apply(self, node: NetNode, interface: str, impairment: Impairment) -> None:
        """Impair what ``node`` receives on ``interface`` (IPv4 and IPv6). Once per
        (node, interface); takes effect at ``start``, or at once when already started."""

    @abstractmethod
    def start(self) -> None:
        """Install everything applied so far; returns when the impairment is in force."""

    @abstractmethod
    def stop(self) -> None:
        """Remove every rule, qdisc and device added and end every process started.
        Idempotent; safe after a failure."""

    @abstractmethod
    def stats(self) -> dict:
        """``{"backend": name, "interfaces": {"node:interface": {"seen", "delayed",
        "dropped_loss", ...}}, ...}``; see each backend for its extra keys."""

    def __enter__(self) -> "ImpairmentBackend":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def iface_key(node: NetNode, interface: str) -> str:
    return f"{node.name}:{interface}"


def detect() -> str:
    """"netem" if this kernel can make a netem qdisc, else "userspace".

    Tries ``tc qdisc add dev lo root netem`` in a throwaway namespace, so nothing the caller
    owns is touched."""
    name = f"ve-netemprobe-{os.getpid()}"
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        raise ImpairmentError(f"cannot make a namespace to probe for netem: {made.stderr.strip()}")
    try:
        probe = subprocess.run(["tc", "-n", name, "qdisc", "add", "dev", "lo", "root", "netem"],
                               capture_output=True, text=True)
        if probe.returncode == 0:
            subprocess.run(["tc", "-n", name, "qdisc", "del", "dev", "lo", "root"],
                           capture_output=True)
        return "netem" if probe.returncode == 0 else "userspace"
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def make_backend(name: str | None = None, **options) -> ImpairmentBackend:
    """The backend called ``name``, or the one this kernel supports when ``name`` is None.
    ``options`` go to the backend's constructor. Asking for netem on a kernel without it is an
    error, never a silent run without impairment."""
    from topology.impairment.netem import NetemBackend
    from topology.impairment.userspace import UserspaceBackend

    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown impairment backend {name!r} (choose from {', '.join(BACKENDS)})")
    if name is None:
        name = detect()
        log.info("impairment backend: %s (chosen automatically%s)", name,
                 "" if name == "netem" else ": this kernel has no sch_netem")
    elif name == "netem" and detect() != "netem":
        raise BackendUnavailable("the netem backend was asked for, but this kernel cannot make a "
                                 "netem qdisc (no sch_netem); use the userspace backend")
    else:
        log.info("impairment backend: %s (asked for)", name)
    return NetemBackend(**options) if name == "netem" else UserspaceBackend(**options)
