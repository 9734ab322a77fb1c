"""One interface, two backends: netem where the kernel has it, the userspace NFQUEUE engine
where it does not. ``detect`` says which this kernel supports and why;
``topology.impairment.factory.make_backend`` makes one (this module imports neither backend:
both import it).

Lifecycle: ``apply`` what each direction should suffer (before or after ``start``), ``start``,
read ``stats`` while traffic runs, ``change`` a direction for a while (a fault) and back,
``stop``. ``stop`` removes everything the backend added
and is safe to call twice or after a failure; the context manager does start/stop.
"""
from __future__ import annotations

import os
import subprocess
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass

from topology.impairment.model import Impairment, NetNode
from topology.netns import NetnsError, refuse_if_forbidden

BACKENDS = ("netem", "userspace")


class ImpairmentError(RuntimeError):
    """The backend could not impair as asked (a missing qdisc, a busy queue, a dead engine)."""


class BackendUnavailable(ImpairmentError):
    """The requested backend cannot run on this kernel."""


class ImpairmentBackend(ABC):
    """Impairs packets RECEIVED on an interface inside a node's namespace, or SENT on it
    (``egress``).

    Which end of a link holds a direction matters to whoever reads kernel receive stamps
    (SO_TIMESTAMPNS, SIOCGSTAMPNS): the kernel stamps a packet when the interface receives it,
    before any hook of that namespace, so a packet held on its receiver's ingress keeps a stamp
    from before its delay. Crossing into the next namespace clears the stamp. A direction into
    a host whose sockets read stamps is therefore held on the sending router's egress
    (topology/world.py); elsewhere on the receiving router's ingress."""

    name: str

    @abstractmethod
    def apply(self, node: NetNode, interface: str, impairment: Impairment,
              egress: bool = False) -> None:
        """Impair what ``node`` receives on ``interface`` (IPv4 and IPv6), or what it sends on
        it (``egress``). Once per (node, interface, direction); takes effect at ``start``, or
        at once when already started."""

    @abstractmethod
    def change(self, node: NetNode, interface: str, impairment: Impairment,
               egress: bool = False) -> None:
        """Replace what ``node`` suffers on ``interface`` in that direction (applied before)
        from now on; packets already held keep their release times. Changing back to the
        applied impairment ends a fault: until then losses count as ``dropped_fault`` in
        ``stats``, not ``dropped_loss``. Raises ``ImpairmentError`` for one never applied."""

    @abstractmethod
    def start(self) -> None:
        """Install everything applied so far; returns when the impairment is in force."""

    @abstractmethod
    def stop(self) -> None:
        """Remove every rule, qdisc and device added and end every process started.
        Idempotent; safe after a failure."""

    @abstractmethod
    def stats(self) -> dict:
        """``{"backend": name, "interfaces": {iface_key: {"seen", "delayed",
        "dropped_loss", "dropped_fault", "held", ...}}, ...}``; see each backend for its extra
        keys."""

    def __enter__(self) -> "ImpairmentBackend":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


EGRESS_SUFFIX = ">"   # "pub1:pub1-eth0>": what pub1 sends on pub1-eth0


def iface_key(node: NetNode | str, interface: str, egress: bool = False) -> str:
    """``node:interface`` (received there), ``node:interface>`` (sent there)."""
    name = node if isinstance(node, str) else node.name
    return f"{name}:{interface}{EGRESS_SUFFIX if egress else ''}"


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
