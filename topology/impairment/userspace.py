"""The userspace backend: iptables NFQUEUE rules in each node, one engine process for all.

For each impaired (node, interface, direction) the backend asks the engine to bind a queue
inside the node's namespace and only then adds ``-t mangle -A PREROUTING -i IF -j NFQUEUE
--queue-num N`` (``POSTROUTING -o IF`` for what the node sends: ``egress``; and the ip6tables
twin), so no packet meets a rule without a reader. There is deliberately no
``--queue-bypass``: if the engine dies, impaired traffic is blackholed, which calibration sees,
instead of flowing unimpaired, which it might not.
"""
from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.procfs import precise_cpu_seconds
from topology.impairment.backend import (ImpairmentBackend, ImpairmentError, iface_key,
                                         never_applied)
from topology.impairment.engine import NATIVE, check_core
from topology.impairment.model import Impairment, NetNode, impairment_to_dict
from voiceedge import reaper

log = logging.getLogger("voiceedge.impairment")

RULE_COMMENT = "voiceedge-impair"
DEFAULT_TICK_US = 100.0  # the native core's busy-mode tick (docs/impairment.md, "Busy mode")
# The engine's SCHED_FIFO priority: above every service the testbed runs (the flood bench's
# relay runs at 10), so a due packet is released when it is due (docs/impairment.md,
# "The wire first").
DEFAULT_REALTIME = 20
_REPO = Path(__file__).resolve().parents[2]


def rule_spec(interface: str, queue: int, egress: bool = False) -> list[str]:
    """The rule (without -A/-D) that hands the packets ``interface`` receives (PREROUTING), or
    sends (POSTROUTING, ``egress``), to ``queue``."""
    where = ["POSTROUTING", "-o", interface] if egress else ["PREROUTING", "-i", interface]
    return [*where, "-m", "comment", "--comment", RULE_COMMENT,
            "-j", "NFQUEUE", "--queue-num", str(queue)]


class EngineChannel:
    """The engine process and its JSON-lines pipe."""

    def __init__(self, python: str, timeout: float, spin_us: float = 0.0,
                 core: str = NATIVE, tick_us: float = 0.0, realtime: int = 0) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._buf = b""
        self._stderr = tempfile.TemporaryFile()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([python, "-m", "topology.impairment.engine",
                                      "--spin-us", str(spin_us), "--core", core,
                                      "--tick-us", str(tick_us),
                                      "--realtime", str(realtime)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, env=env)
        reaper.track_process(self.proc.pid)
        try:
            hello = self._read_reply()
            if not hello.get("ready"):
                raise ImpairmentError(f"the impairment engine did not start: {hello}")
            self.realtime = int(hello.get("realtime", 0))
        except BaseException:
            self.close(timeout=0.5)
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def errors(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace").strip()

    def _read_reply(self) -> dict:
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise ImpairmentError("the impairment engine did not answer in time")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.proc.wait(timeout=2)
                raise ImpairmentError(f"the impairment engine exited "
                                      f"(status {self.proc.returncode}): {self.errors()[-2000:]}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, op: str, **fields) -> dict:
        with self._lock:
            if not self.alive():
                raise ImpairmentError(
                    f"the impairment engine is not running (exit status {self.proc.returncode}); "
                    f"traffic on impaired interfaces is blackholed. {self.errors()[-500:]}")
            try:
                self.proc.stdin.write((json.dumps({"op": op, **fields}) + "\n").encode())
                self.proc.stdin.flush()
            except BrokenPipeError:
                raise ImpairmentError("the impairment engine is gone") from None
            reply = self._read_reply()
        if not reply.get("ok"):
            raise ImpairmentError(reply.get("error", "the impairment engine refused"))
        return reply

    def close(self, timeout: float = 3.0) -> None:
        """Ask the engine to stop (it releases held packets and unbinds), then insist."""
        if self.alive():
            try:
                self.request("stop")
            except ImpairmentError:
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                self.proc.wait(timeout=timeout)
                break
            except subprocess.TimeoutExpired:
                self.proc.send_signal(sig)
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self._stderr):
            try:
                f.close()
            except OSError:
                pass


def cpu_seconds(pid: int) -> float | None:
    """CPU time of the engine process as the scheduler counts it (ns precision)."""
    try:
        return precise_cpu_seconds(pid)
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class _Applied:
    node: NetNode
    interface: str
    impairment: Impairment  # as applied (the configured one)
    queue: int
    egress: bool = False   # what the node sends on the interface (else: what it receives)
    rules: list[list[str]] = field(default_factory=list)  # (binary, *spec) actually added
    current: Impairment | None = None  # set by ``change``; None: the applied one

    @property
    def ipv6(self) -> bool:
        return any(rule[0] == "ip6tables" for rule in self.rules)


class UserspaceBackend(ImpairmentBackend):
    """NFQUEUE + one engine process (``topology.impairment.engine``) for every namespace.

    ``queue_base``: first queue number (queues are numbered per namespace; each applied
    interface gets its own). ``seed``: makes loss and delay draws repeatable. ``ipv6``: add the
    ip6tables rule too (skipped with a warning where ip6tables is missing or refuses).
    ``spin_us``: the engine wakes this much before a release and waits the rest awake (less
    lateness under load, more CPU; see docs/impairment.md). ``core``: where the engine's
    per-packet work runs, "native" (C, topology/impairment/_engine.c) or "python" (the
    reference, engine.py); both make the same decisions. ``tick_us``: the native core reads and
    releases on a tick of this period while packets arrive within it of each other (busy
    mode: fewer wake-ups, each delay off by at most half a tick either way; docs/impairment.md);
    None for the default, 0 for never. ``realtime``: the engine's SCHED_FIFO priority (None for
    the default, 0 for ordinary scheduling); where it is refused the engine runs ordinary and
    ``engine_realtime`` says 0."""

    name = "userspace"

    def __init__(self, queue_base: int = 4200, seed: int | None = None, ipv6: bool = True,
                 python: str = sys.executable, timeout: float = 10.0,
                 spin_us: float = 0.0, core: str = NATIVE,
                 tick_us: float | None = None, realtime: int | None = None) -> None:
        self.spin_us = spin_us
        self.realtime = DEFAULT_REALTIME if realtime is None else realtime
        self.tick_us = (DEFAULT_TICK_US if core == NATIVE else 0.0) if tick_us is None else tick_us
        self.core = check_core(core)
        self.queue_base = queue_base
        self.seed = seed
        self.ipv6 = ipv6
        self.python = python
        self.timeout = timeout
        self._applied: dict[str, _Applied] = {}
        self._next_queue = queue_base
        self._engine: EngineChannel | None = None

    @property
    def engine_pid(self) -> int | None:
        return self._engine.pid if self._engine else None

    @property
    def engine_realtime(self) -> int | None:
        """The SCHED_FIFO priority the running engine got (0: ordinary; None: not started)."""
        return self._engine.realtime if self._engine else None

    def apply(self, node: NetNode, interface: str, impairment: Impairment,
              egress: bool = False) -> None:
        key = iface_key(node, interface, egress)
        if key in self._applied:
            raise ValueError(f"{key} is already impaired")
        app = _Applied(node, interface, impairment, self._next_queue, egress)
        self._next_queue += 1  # never reused: a failed apply may have left its queue bound
        self._applied[key] = app
        if self._engine is not None:
            try:
                self._install(key, app)
            except BaseException:
                self._remove_rules(app)
                del self._applied[key]
                raise

    def change(self, node: NetNode, interface: str, impairment: Impairment,
               egress: bool = False) -> None:
        key = iface_key(node, interface, egress)
        app = self._applied.get(key)
        if app is None:
            raise never_applied(key)
        app.current = impairment
        if self._engine is not None:  # otherwise ``start`` installs it
            self._set(key, impairment)

    def _set(self, key: str, impairment: Impairment) -> None:
        try:
            self._engine.request("set", label=key, impairment=impairment_to_dict(impairment))
        except ImpairmentError as exc:
            raise ImpairmentError(f"{key}: {exc}") from None

    def start(self) -> None:
        if self._engine is not None:
            return
        try:
            self._engine = EngineChannel(self.python, self.timeout, self.spin_us, self.core,
                                         self.tick_us, self.realtime)
            for key, app in self._applied.items():
                self._install(key, app)
        except BaseException:
            self.stop()
            raise

    def _install(self, key: str, app: _Applied) -> None:
        seed = None if self.seed is None else self.seed + app.queue
        try:
            self._engine.request("add", label=key, ns_path=app.node.ns_path, queue=app.queue,
                                 impairment=impairment_to_dict(app.impairment), seed=seed)
        except ImpairmentError as exc:
            raise ImpairmentError(f"{key}: {exc}") from None
        if app.current is not None and app.current != app.impairment:
            self._set(key, app.current)  # changed before start
        binaries = ["iptables"]
        if self.ipv6 and shutil.which("ip6tables"):
            binaries.append("ip6tables")
        for binary in binaries:
            rule = [binary, *rule_spec(app.interface, app.queue, app.egress)]
            try:
                app.node.run(rule[0], "-w", "-t", "mangle", "-A", *rule[1:])
            except RuntimeError as exc:
                if binary == "iptables":
                    raise ImpairmentError(f"{key}: {exc}") from None
                log.warning("%s: no IPv6 impairment: %s", key, exc)
                continue
            app.rules.append(rule)

    @staticmethod
    def _remove_rules(app: _Applied) -> None:
        for rule in reversed(app.rules):
            app.node.run(rule[0], "-w", "-t", "mangle", "-D", *rule[1:], check=False)
        app.rules.clear()

    def stop(self) -> None:
        # Rules first: once they are gone nothing new is queued, and the engine can release
        # what it holds; the other way round, the gap would blackhole packets.
        for app in self._applied.values():
            self._remove_rules(app)
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    def stats(self) -> dict:
        if self._engine is None:
            raise ImpairmentError("the userspace backend is not started")
        raw = self._engine.request("stats")["stats"]
        lateness = raw["lateness_us"]
        interfaces = {}
        for key, app in self._applied.items():
            q = raw["queues"].get(key)
            if q is not None:
                interfaces[key] = {**q, "ipv6": app.ipv6}
        cpu = cpu_seconds(self._engine.pid)
        return {"backend": self.name, "engine_pid": raw["pid"], "core": raw.get("core"),
                "realtime": self._engine.realtime,
                "cpu_seconds": cpu if cpu is not None else raw["cpu_seconds"],
                "lateness_p50_us": lateness["p50"], "lateness_p99_us": lateness["p99"],
                "lateness_max_us": lateness["max"], "releases": lateness["count"],
                "lateness_hist": {int(k): v for k, v in lateness.get("hist", {}).items()},
                "verdict_errors": raw["verdict_errors"], "interfaces": interfaces,
                # busy mode (native core with a tick): releases before their due time, ticks
                "early_max_us": raw.get("early_max_us"), "ticks": raw.get("ticks"),
                # wall-clock second -> worst release lateness (ms), where it reached 2 ms
                "lagged_seconds": raw.get("lagged_seconds", {})}
