"""Packet captures: tcpdump as a context manager, and the capture points of a world.

    with Capture(path, netns=lab.name, bpf_filter="udp and not src net 127.66.0.0/16") as cap:
        ...                      # traffic
    cap.stats.dropped_by_kernel  # tcpdump's own count, after the block
    for d in read_udp(path):     # analysis/pcap/reader.py
        ...

The capture starts inside the namespace when ``netns`` is given (a name under /var/run/netns
via ``ip netns exec``, or a namespace file path via ``nsenter``) and ``__enter__`` returns only
once tcpdump printed "listening on": its socket is bound and the filter attached, so nothing
sent afterwards is missed. It runs in immediate mode: with TPACKET_V3's block buffering, the
packets of a block that had not timed out yet are lost on SIGINT. Stopping sends SIGINT (tcpdump
flushes the file and prints its statistics) and kills it if it does not exit; tcpdump runs in a
session of its own, so a Ctrl-C at the terminal reaches Python, whose ``__exit__`` stops it.

On Linux ``lo`` each datagram appears once in a capture (libpcap drops the outgoing copy; the
kernel's "received by filter" counts both). Every address local to a namespace is routed through
its ``lo``, veth addresses included.

``WorldCapture`` captures a scenario's world (docs/captures.md): one tcpdump per host on
``any`` with Linux cooked v2 headers (each frame says its interface and whether it was sent or
received), routers their sent frames only, each file with a size cap.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from voiceedge.results import CAPTURES_FILE
from voiceedge import reaper

_STAT = re.compile(r"^(\d+) packets? (captured|received by filter|dropped by kernel|"
                   r"dropped by interface)")


class CaptureError(RuntimeError):
    """tcpdump did not start listening (not installed, bad filter, no such interface)."""


@dataclass(frozen=True)
class CaptureStats:
    """tcpdump's own counts, from the lines it prints when it stops (None: not printed)."""
    captured: int | None
    received_by_filter: int | None
    dropped_by_kernel: int | None
    dropped_by_interface: int | None
    returncode: int | None

    @classmethod
    def parse(cls, stderr: str, returncode: int | None) -> "CaptureStats":
        found: dict[str, int] = {}
        for line in stderr.splitlines():
            match = _STAT.match(line.strip())
            if match:
                found[match.group(2)] = int(match.group(1))
        return cls(captured=found.get("captured"),
                   received_by_filter=found.get("received by filter"),
                   dropped_by_kernel=found.get("dropped by kernel"),
                   dropped_by_interface=found.get("dropped by interface"),
                   returncode=returncode)


class Capture:
    """tcpdump writing ``path`` while the ``with`` block runs; ``stats`` once it is over."""

    def __init__(self, path: str | os.PathLike, interface: str = "lo", bpf_filter: str = "udp",
                 netns: str | None = None, snaplen: int = 256, buffer_kib: int = 32768,
                 immediate: bool = True, start_timeout: float = 10.0,
                 link_type: str | None = None, direction: str | None = None) -> None:
        """``snaplen``: bytes kept of each frame (link, IP and UDP headers included: 256 keeps
        the first 214 payload bytes on lo). ``buffer_kib``: the kernel ring (tcpdump -B).
        ``link_type``: tcpdump -y (``LINUX_SLL2`` on ``any`` keeps each frame's interface
        and direction); ``direction``: tcpdump -Q (``in``, ``out``)."""
        self.path = Path(path)
        self.interface = interface
        self.bpf_filter = bpf_filter
        self.netns = netns
        self.snaplen = snaplen
        self.buffer_kib = buffer_kib
        self.immediate = immediate
        self.start_timeout = start_timeout
        self.link_type = link_type
        self.direction = direction
        self.stats: CaptureStats | None = None
        self._proc: subprocess.Popen | None = None
        self._stderr: list[str] = []
        self._reader: threading.Thread | None = None
        self._listening = threading.Event()

    def command(self) -> list[str]:
        if self.netns is None:
            prefix: list[str] = []
        elif self.netns.startswith("/"):
            prefix = ["nsenter", f"--net={self.netns}"]
        else:
            prefix = ["ip", "netns", "exec", self.netns]
        # -Z root: no privilege drop, so the file is the caller's; -n: no name lookups.
        cmd = [*prefix, "tcpdump", "-i", self.interface, "-n", "-Z", "root",
               "-s", str(self.snaplen), "-B", str(self.buffer_kib),
               "--time-stamp-precision", "nano", "-w", str(self.path)]
        if self.immediate:
            cmd.append("--immediate-mode")
        if self.link_type:
            cmd += ["-y", self.link_type]
        if self.direction:
            cmd += ["-Q", self.direction]
        return cmd + [self.bpf_filter]

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> "Capture":
        try:
            # ip netns exec and nsenter exec the command: the pid is tcpdump's.
            self._proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          text=True, start_new_session=True)
            reaper.track_process(self._proc.pid)
        except FileNotFoundError as exc:
            raise CaptureError(f"cannot run {exc.filename} (Debian package tcpdump)") from None
        self._reader = threading.Thread(target=self._read_stderr, name="tcpdump-stderr",
                                        daemon=True)
        self._reader.start()
        try:
            deadline = time.monotonic() + self.start_timeout
            while not self._listening.wait(0.02):
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self._kill()
                    said = " ".join(line.strip() for line in self._stderr[-5:])
                    raise CaptureError(f"tcpdump did not start listening on {self.interface}"
                                       f"{' in ' + self.netns if self.netns else ''}: "
                                       f"{said or 'no output'}")
        except BaseException:
            self._kill()
            raise
        return self

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)
            if "listening on" in line:
                self._listening.set()

    def stop(self, timeout: float = 10.0) -> CaptureStats:
        """SIGINT, wait for tcpdump to flush and exit (SIGKILL after ``timeout``); its stats."""
        proc = self._proc
        if proc is None:
            raise CaptureError("capture was not started")
        if self.stats is not None:
            return self.stats
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        except BaseException:  # Ctrl-C while waiting: leave nothing behind
            self._kill()
            raise
        if self._reader is not None:
            self._reader.join(2.0)
        self.stats = CaptureStats.parse("".join(self._stderr), proc.returncode)
        return self.stats

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def __enter__(self) -> "Capture":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------------- a world's captures

ROUTER_ROLES = ("pub", "bb")


@dataclass
class CapturePoint:
    """One host's capture in a world, and what it recorded.

    End hosts (clients, edges, clusters) capture every UDP frame they send and receive on all
    their interfaces; routers only the frames they send, i.e. each datagram once, after the
    impairment on the interface it arrived by (which happens on ingress, after any capture on
    that interface would have seen it)."""

    host: str
    role: str
    region: str
    file: str                       # name of the pcap, next to captures.json
    sent_only: bool                 # routers
    interfaces: dict[str, dict]     # ifindex -> {"name", "peer"} (peer None for lo)
    bytes: int = 0
    captured: int | None = None
    dropped_by_kernel: int | None = None
    cpu_s: float | None = None      # tcpdump's own CPU time
    capped_after_s: float | None = None  # stopped at the size cap after this long


def capture_hosts(world, client_regions: list[str], clusters: list[str]) -> list[str]:
    """The hosts a scenario's calls can cross: its clients and edges, every router of the
    regions involved, and the clusters."""
    index = world.index
    hosts = [f"client{index[r]}" for r in client_regions]
    hosts += [f"edge{index[r]}" for r in client_regions]
    regions = list(dict.fromkeys(client_regions + clusters))
    hosts += [f"{role}{index[r]}" for r in regions for role in ROUTER_ROLES]
    hosts += [f"cluster{index[r]}" for r in clusters]
    return hosts


class WorldCapture:
    """tcpdump on ``hosts`` of ``world`` into ``directory`` (one ``HOST.pcap`` each and
    ``captures.json``) while the ``with`` block runs. ``poll()`` (call it now and then) stops
    a capture whose file reached ``cap_bytes`` and says so once through ``say``."""

    def __init__(self, world, hosts: list[str], directory: Path, snaplen: int = 256,
                 cap_bytes: int = 64 << 20, say=lambda msg: None) -> None:
        self.world = world
        self.directory = Path(directory)
        self.snaplen = snaplen
        self.cap_bytes = cap_bytes
        self.say = say
        self.points: list[CapturePoint] = []
        for host in hosts:
            role, region = world.role_of(host)
            self.points.append(CapturePoint(host, role, region, f"{host}.pcap",
                                            role in ROUTER_ROLES, {}))
        self._captures: dict[str, Capture] = {}
        self._started = 0.0

    def start(self) -> "WorldCapture":
        from topology.netns import in_namespace

        self.directory.mkdir(parents=True, exist_ok=True)
        self._started = time.monotonic()
        try:
            for point in self.points:
                ns = self.world.node(point.host).ns_path
                point.interfaces = {
                    str(index): {"name": name, "peer": self.world.peers.get(name)}
                    for index, name in in_namespace(ns, socket.if_nameindex)}
                self._captures[point.host] = Capture(
                    self.directory / point.file, interface="any", bpf_filter="udp", netns=ns,
                    snaplen=self.snaplen, buffer_kib=4096, link_type="LINUX_SLL2",
                    direction="out" if point.sent_only else None).start()
        except BaseException:
            self.stop()
            raise
        return self

    def poll(self) -> None:
        for point in self.points:
            cap = self._captures.get(point.host)
            if cap is None or cap.stats is not None:
                continue
            try:
                size = (self.directory / point.file).stat().st_size
            except OSError:
                continue
            if size >= self.cap_bytes:
                point.capped_after_s = round(time.monotonic() - self._started, 1)
                self._stop_one(point)
                self.say(f"capture at {point.host} reached its cap of "
                         f"{self.cap_bytes / 2**20:.3g} MiB after {point.capped_after_s:g} s: "
                         f"nothing later is captured there, and the per-hop analysis leaves "
                         f"out what it would have seen (raise --capture-cap-mb)")

    def _stop_one(self, point: CapturePoint) -> None:
        cap = self._captures.get(point.host)
        if cap is None:
            return
        if cap.stats is None and cap.pid is not None:
            point.cpu_s = _cpu_seconds(cap.pid)
        stats = cap.stop()
        point.captured, point.dropped_by_kernel = stats.captured, stats.dropped_by_kernel

    def stop(self) -> list[CapturePoint]:
        """Stop every capture (idempotent) and write ``captures.json``."""
        for point in self.points:
            try:
                self._stop_one(point)
            except CaptureError:
                continue
            try:
                point.bytes = (self.directory / point.file).stat().st_size
            except OSError:
                point.bytes = 0
        if self.directory.exists():
            (self.directory / CAPTURES_FILE).write_text(json.dumps({
                "snaplen": self.snaplen, "cap_bytes": self.cap_bytes,
                "seconds": round(time.monotonic() - self._started, 1),
                "points": [asdict(p) for p in self.points if p.host in self._captures]},
                indent=2))
        return self.points

    def __enter__(self) -> "WorldCapture":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _cpu_seconds(pid: int) -> float | None:
    from services.procfs import cpu_seconds, stat_fields

    try:
        return round(cpu_seconds(stat_fields(pid)), 3)
    except OSError:
        return None
