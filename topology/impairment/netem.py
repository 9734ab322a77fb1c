"""The netem backend: ingress impairment through an IFB device.

netem shapes what a device SENDS, so for what an interface receives: an IFB device per
interface, the interface's ingress redirected to it (``ingress`` qdisc + u32 catch-all filter +
``mirred egress redirect``), netem as the IFB's root qdisc. The command lists are pure functions
(``netem_commands``, ``teardown_commands``) so they can be checked where netem cannot run.

Reordering: with jitter, netem sorts packets by their own send times, so they overtake each
other (netem's default, ``reorder=True``). For ``reorder=False`` we add ``rate 10gbit``: with a
rate netem computes each send time from the previous packet's (max(arrival + delay, previous) +
serialisation), which keeps order and costs ~1.2 us per 1500 bytes. (The older advice, a
``pfifo`` child qdisc, no longer prevents reordering: netem moves packets to the child in
send-time order.) With a configured ``rate`` netem never reorders, whatever ``reorder`` says;
the userspace engine follows the same rule.

Uniform jitter: ``Impairment.jitter_ms`` is a standard deviation; netem's plain ``delay D J``
is uniform on D +- J, so J = jitter * sqrt 3.

Changing at runtime (``change``): ``tc qdisc change`` on the IFB's netem, which keeps the
packets it holds with their send times. netem resets the loss model, delay and limit on a
change but keeps a rate or a delay distribution table that the new options leave out, so a
change that would leave one behind is refused (``change_problem``). Fault drops are the
difference of netem's drop counter between the change and the change back.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from topology.impairment.backend import (ImpairmentBackend, ImpairmentError, iface_key,
                                         never_applied)
from topology.impairment.model import BernoulliLoss, GilbertElliottLoss, Impairment, NetNode

NETEM_LIMIT = 20000  # packets netem may hold (its default, 1000, overflows at high rates)
FIFO_RATE = "10gbit"


def _us(ms: float) -> str:
    return f"{round(ms * 1000)}us"


def _pct(value: float) -> str:
    return f"{value:g}%"


def netem_args(imp: Impairment) -> list[str]:
    """The netem options (after ``netem``) for ``imp``."""
    args = ["limit", str(NETEM_LIMIT)]
    if imp.delay_ms or imp.jitter_ms:
        args += ["delay", _us(imp.delay_ms)]
        if imp.jitter_ms and imp.distribution == "normal":
            args += [_us(imp.jitter_ms), "distribution", "normal"]
        elif imp.jitter_ms:
            args += [_us(imp.jitter_ms * math.sqrt(3))]
    if isinstance(imp.loss, BernoulliLoss):
        args += ["loss", "random", _pct(imp.loss.pct)]
    elif isinstance(imp.loss, GilbertElliottLoss):
        loss = imp.loss
        args += ["loss", "gemodel", _pct(loss.p), _pct(loss.r), _pct(loss.bad_loss),
                 _pct(loss.good_loss)]
    if imp.rate_mbit is not None:
        args += ["rate", f"{round(imp.rate_mbit * 1e6)}bit"]
    elif imp.jitter_ms and not imp.reorder:
        args += ["rate", FIFO_RATE]
    return args


def netem_commands(interface: str, ifb: str, impairment: Impairment,
                   egress: bool = False) -> list[list[str]]:
    """Commands, to run inside the node's namespace, that impair what ``interface`` receives
    (netem goes on the IFB before the redirect, so no packet passes unimpaired meanwhile), or
    what it sends (``egress``: netem as its root qdisc; no IFB)."""
    if egress:
        return [["tc", "qdisc", "add", "dev", interface, "root", "handle", "1:", "netem",
                 *netem_args(impairment)]]
    return [
        ["ip", "link", "add", ifb, "type", "ifb"],
        ["ip", "link", "set", ifb, "up"],
        ["tc", "qdisc", "add", "dev", ifb, "root", "handle", "1:", "netem",
         *netem_args(impairment)],
        ["tc", "qdisc", "add", "dev", interface, "handle", "ffff:", "ingress"],
        ["tc", "filter", "add", "dev", interface, "parent", "ffff:", "protocol", "all",
         "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", ifb],
    ]


def change_command(device: str, impairment: Impairment) -> list[str]:
    """The command that puts ``impairment`` on ``device``'s netem (the IFB, or the interface
    itself for egress) in place of what it had."""
    return ["tc", "qdisc", "change", "dev", device, "root", "handle", "1:", "netem",
            *netem_args(impairment)]


def change_problem(old: Impairment, new: Impairment) -> str | None:
    """Why ``tc qdisc change`` from ``old`` to ``new`` would not give ``new``, or None: netem
    keeps a rate and a delay distribution table that a change does not give again."""
    before, after = netem_args(old), netem_args(new)
    if "rate" in before and "rate" not in after:
        return "netem would keep the old rate (a change without a rate leaves it in place)"
    if "distribution" in before and new.jitter_ms and "distribution" not in after:
        return ("netem would keep the old normal delay distribution (a change without a "
                "distribution leaves it in place)")
    return None


def teardown_commands(interface: str, ifb: str, egress: bool = False) -> list[list[str]]:
    """Undo ``netem_commands``: the redirect first, then the IFB (and its netem with it); for
    egress, the interface's root qdisc."""
    if egress:
        return [["tc", "qdisc", "del", "dev", interface, "root"]]
    return [
        ["tc", "qdisc", "del", "dev", interface, "handle", "ffff:", "ingress"],
        ["ip", "link", "del", ifb],
    ]


_SENT = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+) requeues (\d+)\)")
_BACKLOG = re.compile(r"backlog \S+ (\d+)p")


def parse_qdisc_stats(text: str) -> dict:
    """Counters of the first qdisc in ``tc -s qdisc show dev IFB`` output. netem counts a
    packet it loses, and one that finds its queue full, as dropped."""
    sent, backlog = _SENT.search(text), _BACKLOG.search(text)
    if sent is None:
        return {}
    delayed, dropped = int(sent.group(2)), int(sent.group(3))
    held = int(backlog.group(1)) if backlog else 0
    return {"seen": delayed + dropped + held, "delayed": delayed, "dropped_loss": dropped,
            "held": held}


@dataclass
class _Applied:
    node: NetNode
    interface: str
    impairment: Impairment  # as applied (the configured one)
    ifb: str               # unused for egress
    egress: bool = False   # what the node sends on the interface (else: what it receives)
    done: list[list[str]] = field(default_factory=list)  # commands that succeeded
    current: Impairment | None = None  # set by ``change``; None: the applied one
    fault_dropped: int = 0  # netem drops during faults that have ended
    fault_base: int | None = None  # netem's drop count when the fault in force began

    @property
    def in_force(self) -> Impairment:
        return self.impairment if self.current is None else self.current

    @property
    def device(self) -> str:
        """Where the netem qdisc is."""
        return self.interface if self.egress else self.ifb

    def dropped(self) -> int:
        text = self.node.run("tc", "-s", "qdisc", "show", "dev", self.device, check=False)
        return parse_qdisc_stats(text).get("dropped_loss", 0)


class NetemBackend(ImpairmentBackend):
    """Kernel netem on an IFB per interface impaired on ingress, as the root qdisc of one
    impaired on egress. Stats are netem's counters."""

    name = "netem"

    def __init__(self, ifb_prefix: str = "vifb") -> None:
        self.ifb_prefix = ifb_prefix
        self._applied: dict[str, _Applied] = {}
        self._started = False

    def apply(self, node: NetNode, interface: str, impairment: Impairment,
              egress: bool = False) -> None:
        key = iface_key(node, interface, egress)
        if key in self._applied:
            raise ValueError(f"{key} is already impaired")
        n = sum(1 for a in self._applied.values() if a.node.ns_path == node.ns_path)
        app = _Applied(node, interface, impairment, f"{self.ifb_prefix}{n}", egress)
        self._applied[key] = app
        if self._started:
            self._install(key, app)

    def change(self, node: NetNode, interface: str, impairment: Impairment,
               egress: bool = False) -> None:
        key = iface_key(node, interface, egress)
        app = self._applied.get(key)
        if app is None:
            raise never_applied(key)
        problem = change_problem(app.in_force, impairment)
        if problem:
            raise ImpairmentError(f"netem on {key}: cannot change to {impairment}: {problem}")
        if app.done:
            dropped = app.dropped()
            try:
                app.node.run(*change_command(app.device, impairment))
            except RuntimeError as exc:
                raise ImpairmentError(f"netem on {key}: {exc}") from None
            if app.fault_base is not None:
                app.fault_dropped += dropped - app.fault_base
            app.fault_base = dropped if impairment != app.impairment else None
        app.current = impairment

    def start(self) -> None:
        self._started = True
        try:
            for key, app in self._applied.items():
                if not app.done:
                    self._install(key, app)
        except BaseException:
            self.stop()
            raise

    def _install(self, key: str, app: _Applied) -> None:
        app.fault_dropped = 0
        app.fault_base = 0 if app.in_force != app.impairment else None
        for cmd in netem_commands(app.interface, app.ifb, app.in_force, app.egress):
            try:
                app.node.run(*cmd)
            except RuntimeError as exc:
                self._teardown(app)
                raise ImpairmentError(f"netem on {key}: {exc}") from None
            app.done.append(cmd)

    @staticmethod
    def _teardown(app: _Applied) -> None:
        if not app.done:
            return
        redirected = app.egress or any(cmd[:3] == ["tc", "qdisc", "add"] and "ingress" in cmd
                                       for cmd in app.done)
        for cmd in teardown_commands(app.interface, app.ifb, app.egress):
            if cmd[0] == "tc" and not redirected:
                continue
            app.node.run(*cmd, check=False)
        app.done.clear()

    def stop(self) -> None:
        for app in reversed(list(self._applied.values())):
            self._teardown(app)
        self._started = False

    def stats(self) -> dict:
        interfaces = {}
        for key, app in self._applied.items():
            text = app.node.run("tc", "-s", "qdisc", "show", "dev", app.device, check=False)
            counters = parse_qdisc_stats(text)
            if counters:
                fault = app.fault_dropped
                if app.fault_base is not None:
                    fault += counters["dropped_loss"] - app.fault_base
                counters["dropped_loss"] -= fault
                counters["dropped_fault"] = fault
            interfaces[key] = {"ifb": None if app.egress else app.ifb, **counters,
                               "fault": app.in_force != app.impairment}
        return {"backend": self.name, "cpu_seconds": None, "lateness_p50_us": None,
                "lateness_p99_us": None, "interfaces": interfaces}
