"""Batched UDP I/O (recvmmsg/sendmmsg) on preallocated buffers.

CPython's socket module has no recvmmsg/sendmmsg; the relay's C helper (_fastpath.c) exports
them. Every buffer the kernel reads or writes is allocated once: receive slots, source
addresses, message headers and iovecs; Python reads and writes their fields through
``memoryview.cast`` views. x86_64 and aarch64 Linux (LP64) layouts.
"""
from __future__ import annotations

import ctypes
import errno
import os
import socket

MSG_DONTWAIT = 0x40
MSG_TRUNC = 0x20


try:
    from services.relay._fastpath import recvmmsg, sendmmsg
except ImportError as exc:  # pragma: no cover - a broken install, not a runtime condition
    raise ImportError("the relay's C helper services/relay/_fastpath.c is not built: "
                      "run `make venv` (it needs gcc and python3-dev)") from exc

MMSGHDR_SIZE = 64  # struct mmsghdr: msghdr (56) + msg_len (4) + padding
IOVEC_SIZE = 16
NAME_SLOT = 32  # room for a sockaddr_in6 (28), 8-byte aligned

# struct msghdr as 8-byte words: 0 msg_name, 1 msg_namelen, 2 msg_iov, 3 msg_iovlen,
# 4 msg_control, 5 msg_controllen, 6 msg_flags; word 7 holds msg_len (low 32 bits).
_W_NAME, _W_NAMELEN, _W_IOV, _W_IOVLEN = 0, 1, 2, 3
# As 4-byte words: msg_flags at 12, msg_len at 14.
_D_FLAGS, _D_LEN = 12, 14


def address_of(buf: bytearray) -> int:
    """Address of a bytearray's storage (the bytearray must never be resized)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))  # no array type per call: 2x faster


class RecvBatch:
    """Receives up to ``size`` datagrams per call into fixed slots.

    After ``recv`` returned n, datagram i is ``view[i*slot : i*slot + length(i)]`` and its
    source address is the sockaddr at ``names[i*NAME_SLOT:]``.
    """

    CONTROL_SLOT = 64  # room for one SCM_TIMESTAMPNS message (cmsghdr 16 + timespec 16)

    def __init__(self, size: int = 64, slot: int = 2048, timestamps: bool = False) -> None:
        self.size, self.slot = size, slot
        self.data = bytearray(size * slot)
        self.names = bytearray(size * NAME_SLOT)
        self._hdrs = bytearray(size * MMSGHDR_SIZE)
        self._iovs = bytearray(size * IOVEC_SIZE)
        self.view = memoryview(self.data)
        self.data_q = self.view.cast("Q")  # 8-byte words of the data slots
        self.names_view = memoryview(self.names)
        self.names_q = self.names_view.cast("Q")
        self._hdr_d = memoryview(self._hdrs).cast("I")
        self.data_addr = address_of(self.data)
        self.hdrs_addr = address_of(self._hdrs)
        names_addr, iovs_addr = address_of(self.names), address_of(self._iovs)
        iov_q, hdr_q = memoryview(self._iovs).cast("Q"), memoryview(self._hdrs).cast("Q")
        # Kernel receive timestamps (SO_TIMESTAMPNS): tv_sec at control word 8*i+2, tv_nsec +3.
        self.control = bytearray(size * self.CONTROL_SLOT if timestamps else 0)
        self.control_q = memoryview(self.control).cast("Q") if timestamps else None
        control_addr = address_of(self.control) if timestamps else 0
        for i in range(size):
            if timestamps:
                hdr_q[i * (MMSGHDR_SIZE // 8) + 4] = control_addr + i * self.CONTROL_SLOT
                hdr_q[i * (MMSGHDR_SIZE // 8) + 5] = self.CONTROL_SLOT
            iov_q[2 * i] = self.data_addr + i * slot
            iov_q[2 * i + 1] = slot
            base = i * (MMSGHDR_SIZE // 8)
            hdr_q[base + _W_NAME] = names_addr + i * NAME_SLOT
            hdr_q[base + _W_NAMELEN] = NAME_SLOT
            hdr_q[base + _W_IOV] = iovs_addr + i * IOVEC_SIZE
            hdr_q[base + _W_IOVLEN] = 1
        self._timestamps = timestamps
        self._template = bytes(self._hdrs)
        self._template_addr = ctypes.cast(ctypes.c_char_p(self._template), ctypes.c_void_p).value

    def recv(self, fd: int) -> int:
        """Datagrams received without blocking (0 when none are waiting)."""
        if self._timestamps:
            # The kernel shrinks msg_controllen to what it wrote: restore the template. (It
            # also rewrites msg_namelen, but always to the same size for one socket's family.)
            ctypes.memmove(self.hdrs_addr, self._template_addr, len(self._template))
        n = recvmmsg(fd, self.hdrs_addr, self.size, MSG_DONTWAIT)
        if n < 0:
            if -n in (errno.EAGAIN, errno.EINTR):
                return 0
            raise OSError(-n, os.strerror(-n))
        return n

    def timestamp_ns(self, i: int) -> int:
        """Kernel receive time (CLOCK_REALTIME) of datagram i; needs ``timestamps=True`` and
        SO_TIMESTAMPNS on the socket."""
        q = self.control_q
        return q[8 * i + 2] * 1_000_000_000 + q[8 * i + 3]

    def length(self, i: int) -> int:
        return self._hdr_d[i * 16 + _D_LEN]

    def truncated(self, i: int) -> bool:
        return bool(self._hdr_d[i * 16 + _D_FLAGS] & MSG_TRUNC)

    def lengths_and_flags(self) -> memoryview:
        """The raw 4-byte-word view: length of i at [16*i+14], flags at [16*i+12]."""
        return self._hdr_d

    def source(self, i: int) -> bytes:
        """Source sockaddr of datagram i, as bytes (16 for IPv4, 28 for IPv6)."""
        off = i * NAME_SLOT
        family = self.names[off] | (self.names[off + 1] << 8)
        return bytes(self.names[off:off + (16 if family == socket.AF_INET else 28)])


class SendBatch:
    """Collects up to ``size`` datagrams, each of one or two buffers, then sends them at once."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self.count = 0
        self.failed = 0  # datagrams the kernel refused, since the last reset by the caller
        self._hdrs = bytearray(size * MMSGHDR_SIZE)
        self._iovs = bytearray(size * 2 * IOVEC_SIZE)
        self.hdrs_addr = address_of(self._hdrs)
        self.iovs_addr = iovs_addr = address_of(self._iovs)
        self._hdr_q = memoryview(self._hdrs).cast("Q")
        self._iov_q = memoryview(self._iovs).cast("Q")
        for i in range(size):
            self._hdr_q[i * 8 + _W_IOV] = iovs_addr + i * 2 * IOVEC_SIZE

    def add(self, name: int, namelen: int, base0: int, len0: int, base1: int = 0,
            len1: int = 0) -> bool:
        """Queue one datagram to the sockaddr at ``name``; False when the batch is full."""
        i = self.count
        if i == self.size:
            return False
        h, v = i * 8, i * 4
        hq, iq = self._hdr_q, self._iov_q
        hq[h] = name
        hq[h + 1] = namelen
        iq[v] = base0
        iq[v + 1] = len0
        if len1:
            iq[v + 2] = base1
            iq[v + 3] = len1
            hq[h + 3] = 2
        else:
            hq[h + 3] = 1
        self.count = i + 1
        return True

    def flush(self, fd: int) -> int:
        """Send everything queued; returns how many datagrams were sent."""
        total, start = 0, 0
        while start < self.count:
            n = sendmmsg(fd, self.hdrs_addr + start * MMSGHDR_SIZE, self.count - start, 0)
            if n < 0:
                # The datagram at `start` was refused (buffer full, unreachable): skip it.
                self.failed += 1
                start += 1
                continue
            total += n
            start += n
        self.count = 0
        return total


def sockaddr(host: str, port: int) -> bytes:
    """A ``struct sockaddr_in`` / ``sockaddr_in6`` for (host, port)."""
    if ":" in host:
        packed = socket.inet_pton(socket.AF_INET6, host)
        return (socket.AF_INET6.to_bytes(2, "little") + port.to_bytes(2, "big") + bytes(4)
                + packed + bytes(4))
    packed = socket.inet_pton(socket.AF_INET, host)
    return socket.AF_INET.to_bytes(2, "little") + port.to_bytes(2, "big") + packed + bytes(8)


def sockaddr_to_tuple(raw: bytes) -> tuple[str, int]:
    family = raw[0] | (raw[1] << 8)
    port = (raw[2] << 8) | raw[3]
    if family == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port
    return socket.inet_ntop(socket.AF_INET, raw[4:8]), port
