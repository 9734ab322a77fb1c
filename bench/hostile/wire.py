"""Wire captures for the hostile-input benchmarks: tcpdump as a context manager, and a fast
reader of the UDP datagrams it wrote.

    with Capture(path, netns=lab.name, bpf_filter="udp and not src net 127.66.0.0/16") as cap:
        ...                      # traffic
    cap.stats.dropped_by_kernel  # tcpdump's own count, after the block
    for d in read_udp(path):     # (timestamp_s, src_ip, src_port, dst_ip, dst_port, payload)
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
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

from scapy.utils import RawPcapNgReader, RawPcapReader

# Linktypes (https://www.tcpdump.org/linktypes.html) -> (header length, offset of the EtherType
# or None when the link layer carries IP only).
_LINK = {
    1: (14, 12),     # EN10MB; Linux lo too, with a zeroed Ethernet header
    113: (16, 14),   # LINUX_SLL ("-i any")
    276: (20, 0),    # LINUX_SLL2
    101: (0, None),  # RAW
    12: (0, None),   # RAW (OpenBSD numbering, written by some libpcaps)
    228: (0, None),  # IPV4
}
_ETH_IPV4 = b"\x08\x00"
_ETH_VLAN = b"\x81\x00"
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
                 immediate: bool = True, start_timeout: float = 10.0) -> None:
        """``snaplen``: bytes kept of each frame (link, IP and UDP headers included: 256 keeps
        the first 214 payload bytes on lo). ``buffer_kib``: the kernel ring (tcpdump -B)."""
        self.path = Path(path)
        self.interface = interface
        self.bpf_filter = bpf_filter
        self.netns = netns
        self.snaplen = snaplen
        self.buffer_kib = buffer_kib
        self.immediate = immediate
        self.start_timeout = start_timeout
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


class Datagram(NamedTuple):
    timestamp_s: float
    src_ip: str
    src_port: int
    dst_ip: str
    dst_port: int
    payload: bytes  # cut at the capture's snaplen


def read_udp(path: str | os.PathLike) -> Iterator[Datagram]:
    """The IPv4 UDP datagrams of a pcap (or pcapng) file, in file order.

    Headers are parsed by hand from the raw frames (no scapy layers): about a microsecond a
    packet. Timestamps are float seconds (resolution about 0.5 us at today's epoch); non-IPv4,
    non-UDP frames and non-first fragments are skipped.
    """
    ntoa = socket.inet_ntoa
    with RawPcapReader(str(path)) as reader:
        ng = isinstance(reader, RawPcapNgReader)
        if not ng:
            link = _link(reader.linktype)
            scale = 1e-9 if reader.nano else 1e-6
        for frame, meta in reader:
            if ng:
                link = _link(meta.linktype)
                ts = ((meta.tshigh << 32) | meta.tslow) / meta.tsresol
            else:
                ts = meta.sec + meta.usec * scale
            off, ethertype_at = link
            if ethertype_at is not None:
                kind = frame[ethertype_at:ethertype_at + 2]
                if kind == _ETH_VLAN and off == 14:
                    kind, off = frame[16:18], 18
                if kind != _ETH_IPV4:
                    continue
            if len(frame) < off + 28 or frame[off] >> 4 != 4 or frame[off + 9] != 17:
                continue
            if (frame[off + 6] & 0x1F) or frame[off + 7]:  # not the first fragment
                continue
            udp = off + (frame[off] & 0x0F) * 4
            ulen = (frame[udp + 4] << 8) | frame[udp + 5]
            yield Datagram(ts, ntoa(frame[off + 12:off + 16]),
                           (frame[udp] << 8) | frame[udp + 1],
                           ntoa(frame[off + 16:off + 20]),
                           (frame[udp + 2] << 8) | frame[udp + 3],
                           frame[udp + 8:udp + max(ulen, 8)])


def _link(linktype: int) -> tuple[int, int | None]:
    try:
        return _LINK[linktype]
    except KeyError:
        raise CaptureError(f"unsupported pcap linktype {linktype}") from None
