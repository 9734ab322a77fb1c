"""One interface, two backends: netem where the kernel has it, the userspace NFQUEUE engine
where it does not. ``make_backend(None)`` picks one by asking the kernel (``detect``,
which says which and why).

Lifecycle: ``apply`` what each direction should suffer (before or after ``start``), ``start``,
read ``stats`` while traffic runs, ``change`` a direction for a while (a fault) and back,
``stop``. ``stop`` removes everything the backend added
and is safe to call twice or after a failure; the context manager does start/stop.
"""
from __future__ import annotations

import logging
import os
import subprocess
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass

from topology.impairment.model import Impairment, NetNode
from topology.netns import NetnsError, refuse_if_forbidden

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
    def change(self, node: NetNode, interface: str, impairment: Impairment) -> None:
        """Replace what ``node`` suffers on ``interface`` (applied before) from now on; packets
        already held keep their release times. Changing back to the applied impairment ends a
        fault: until then losses count as ``dropped_fault`` in ``stats``, not ``dropped_loss``.
        Raises ``ImpairmentError`` for a (node, interface) never applied."""

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
        "dropped_loss", "dropped_fault", "held", ...}}, ...}``; see each backend for its extra
        keys."""

    def __enter__(self) -> "ImpairmentBackend":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def iface_key(node: NetNode, interface: str) -> str:
    return f"{node.name}:{interface}"


def never_applied(key: str) -> ImpairmentError:
    return ImpairmentError(f"{key} was never applied: there is no impairment to change")


@dataclass(frozen=True)
class Detection:
    """The backend this kernel supports, and why: what the netem check answered."""

    name: str    # "netem" or "userspace"
    reason: str  # one line, e.g. "this kernel has no sch_netem (tc: ...)"


def detect() -> Detection:
    """Which backend this kernel supports: "netem" if it can make a netem qdisc, else
    "userspace".

    Tries ``tc qdisc add dev lo root netem`` in a throwaway namespace, so nothing the caller
    owns is touched; the reason quotes tc's answer when it refuses."""
    name = f"ve-netemprobe-{os.getpid()}-{threading.get_native_id()}"
    try:
        refuse_if_forbidden(f"network namespace {name}")  # the test suite's guard
    except NetnsError as exc:
        raise ImpairmentError(str(exc)) from None
    try:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
        if made.returncode != 0:
            raise ImpairmentError(f"cannot make a namespace to probe for netem: "
                                  f"{made.stderr.strip()}")
        try:
            probe = subprocess.run(["tc", "-n", name, "qdisc", "add", "dev", "lo", "root",
                                    "netem"], capture_output=True, text=True)
        finally:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    except FileNotFoundError as exc:
        raise ImpairmentError(f"{exc.filename} is not installed (Debian package iproute2)") \
            from None
    if probe.returncode == 0:
        return Detection("netem", "this kernel can make a netem qdisc (sch_netem)")
    answer = " ".join(probe.stderr.split()) or f"exit status {probe.returncode}"
    return Detection("userspace", f"this kernel has no sch_netem (tc qdisc add ... netem: "
                                  f"{answer})")


def make_backend(name: str | None = None, **options) -> ImpairmentBackend:
    """The backend called ``name``, or the one this kernel supports when ``name`` is None
    (``detect``; the choice and its reason are logged). ``options`` go to the backend's
    constructor. Asking for netem on a kernel without it is an error, never a silent run
    without impairment."""
    from topology.impairment.netem import NetemBackend
    from topology.impairment.userspace import UserspaceBackend

    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown impairment backend {name!r} (choose from {', '.join(BACKENDS)})")
    if name is None:
        found = detect()
        name = found.name
        log.info("impairment backend: %s (chosen automatically: %s)", name, found.reason)
    elif name == "netem":
        found = detect()
        if found.name != "netem":
            raise BackendUnavailable(f"the netem backend was asked for, but {found.reason}; "
                                     f"use the userspace backend")
        log.info("impairment backend: netem (asked for; %s)", found.reason)
    else:
        log.info("impairment backend: %s (asked for)", name)
    return NetemBackend(**options) if name == "netem" else UserspaceBackend(**options)
