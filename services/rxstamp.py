"""When a datagram reached the host, not when the event loop got round to it.

A client that times a response in ``datagram_received`` counts, besides the network, however
long its event loop was busy elsewhere (another session's key generation, a garbage
collection, a host that Chromium keeps busy): seen in CI as a 70 ms TURN Allocate on a 12 ms
last mile. The kernel stamps every datagram it queues on a socket that asked for it, and
``SIOCGSTAMPNS`` returns the stamp of the datagram the socket handed over last: read inside
``datagram_received``, that is the response's own arrival (wall clock, CLOCK_REALTIME).

The kernel stamps a socket's datagrams only once asked, so ``ReceiveStamps.enable()`` goes
before the datagrams that matter (the first ask answers ENOENT: nothing stamped yet). A socket
that also has SO_TIMESTAMP(NS) set (the media plane's, services/mediaplane/, reads its stamps
from each datagram's control message) no longer updates the stamp this reads: ``last()`` then
says None, and the caller keeps its own time.
"""
from __future__ import annotations

import errno
import fcntl
import socket
import struct
from typing import Any

SIOCGSTAMPNS = 0x8907            # linux/sockios.h: struct timespec of the last datagram read
_TIMESPEC = struct.Struct("qq")  # tv_sec, tv_nsec (64-bit)
_EMPTY = bytes(_TIMESPEC.size)
# per-message stamps (control messages) instead: SO_TIMESTAMP, SO_TIMESTAMPNS (linux/socket.h)
_PER_MESSAGE = (getattr(socket, "SO_TIMESTAMP", 29), getattr(socket, "SO_TIMESTAMPNS", 35))


class ReceiveStamps:
    """The receive stamps of one datagram socket (None: no socket, e.g. a relayed transport)."""

    def __init__(self, sock: socket.socket | None) -> None:
        self._sock = sock

    @classmethod
    def of(cls, transport: Any) -> "ReceiveStamps":
        """For an asyncio transport's socket, if it is a datagram one (a stream's bytes have
        no one arrival)."""
        get = getattr(transport, "get_extra_info", None)
        sock = get("socket") if get is not None else None
        return cls(sock if sock is not None and sock.type == socket.SOCK_DGRAM else None)

    def enable(self) -> bool:
        """Ask the kernel to stamp this socket's datagrams; False if it cannot be asked."""
        try:
            self._read()
        except OSError as exc:
            return exc.errno == errno.ENOENT  # asked; nothing received since
        except (AttributeError, ValueError):  # no socket, or a closed one
            return False
        return True

    def last(self) -> float | None:
        """Wall-clock receive time (s) of the datagram read last from the socket, or None."""
        try:
            if any(self._sock.getsockopt(socket.SOL_SOCKET, option) for option in _PER_MESSAGE):
                return None  # the stamp is stale: see the module's docstring
            return self._read()
        except (OSError, AttributeError, ValueError):
            return None

    def _read(self) -> float:
        sec, nsec = _TIMESPEC.unpack(fcntl.ioctl(self._sock.fileno(), SIOCGSTAMPNS, _EMPTY))
        return sec + nsec / 1e9
