"""The nfnetlink_queue protocol by hand: config and verdict messages, packet parsing, and a
bound queue socket. Layouts from <linux/netfilter/nfnetlink_queue.h>.

Every message is ``nlmsghdr`` (host order) + ``nfgenmsg`` (family, version, queue number in
network order) + attributes (``nlattr`` in host order, 4-byte aligned, most payloads in
network order).
"""
from __future__ import annotations

import errno
import os
import select
import socket
import struct
from dataclasses import dataclass, field

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
SO_RCVBUFFORCE = 33

NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLMSG_ERROR = 0x2

NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = NFNL_SUBSYS_QUEUE << 8 | 0
NFQNL_MSG_VERDICT = NFNL_SUBSYS_QUEUE << 8 | 1
NFQNL_MSG_CONFIG = NFNL_SUBSYS_QUEUE << 8 | 2

NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_PAYLOAD = 10
NFQA_CAP_LEN = 13

NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQA_CFG_F_FAIL_OPEN = 1 << 0
NFQA_CFG_F_GSO = 1 << 2

NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_CFG_CMD_PF_BIND = 3
NFQNL_COPY_PACKET = 2

NF_DROP = 0
NF_ACCEPT = 1

_NLMSGHDR = struct.Struct("=IHHII")
_NFGEN = struct.Struct("=BBH")  # res_id is pre-swapped with htons
_NLATTR = struct.Struct("=HH")
_VERDICT_BODY = struct.Struct(">II")
_HDR_LEN = _NLMSGHDR.size + _NFGEN.size  # 20: where the attributes start
NLA_TYPE_MASK = 0x3FFF


def _align(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    size = _NLATTR.size + len(payload)
    return _NLATTR.pack(size, kind) + payload + b"\0" * (_align(size) - size)


def message(msg_type: int, queue: int, attrs: bytes, *, flags: int = NLM_F_REQUEST,
            seq: int = 0, family: int = socket.AF_UNSPEC) -> bytes:
    """A whole nfnetlink message addressed to queue ``queue``."""
    size = _HDR_LEN + len(attrs)
    return (_NLMSGHDR.pack(size, msg_type, flags, seq, 0)
            + _NFGEN.pack(family, 0, socket.htons(queue)) + attrs)


def config_messages(queue: int, *, copy_range: int, maxlen: int, seq: int = 1) -> list[bytes]:
    """Bind ``queue``, copy the first ``copy_range`` bytes, raise its max length, and make sure
    fail-open is off (a full queue drops rather than passing packets unimpaired). Each asks
    for an ack."""
    flags = NLM_F_REQUEST | NLM_F_ACK
    return [
        # PF_BIND is a no-op on kernels since 3.8, harmless before.
        message(NFQNL_MSG_CONFIG, 0, attr(NFQA_CFG_CMD, struct.pack(">BxH", NFQNL_CFG_CMD_PF_BIND,
                                                                    socket.AF_INET)),
                flags=flags, seq=seq, family=socket.AF_INET),
        message(NFQNL_MSG_CONFIG, queue, attr(NFQA_CFG_CMD, struct.pack(">BxH", NFQNL_CFG_CMD_BIND, 0)),
                flags=flags, seq=seq + 1),
        message(NFQNL_MSG_CONFIG, queue,
                attr(NFQA_CFG_PARAMS, struct.pack(">IB", copy_range, NFQNL_COPY_PACKET)),
                flags=flags, seq=seq + 2),
        message(NFQNL_MSG_CONFIG, queue, attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", maxlen)),
                flags=flags, seq=seq + 3),
        message(NFQNL_MSG_CONFIG, queue,
                attr(NFQA_CFG_MASK, struct.pack(">I", NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO))
                + attr(NFQA_CFG_FLAGS, struct.pack(">I", 0)),
                flags=flags, seq=seq + 4),
    ]


def unbind_message(queue: int) -> bytes:
    return message(NFQNL_MSG_CONFIG, queue,
                   attr(NFQA_CFG_CMD, struct.pack(">BxH", NFQNL_CFG_CMD_UNBIND, 0)))


def verdict_prefix(queue: int) -> bytes:
    """Everything of a verdict message but its 8-byte body (verdict, packet id)."""
    size = _HDR_LEN + _NLATTR.size + _VERDICT_BODY.size
    return (_NLMSGHDR.pack(size, NFQNL_MSG_VERDICT, NLM_F_REQUEST, 0, 0)
            + _NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(queue))
            + _NLATTR.pack(_NLATTR.size + _VERDICT_BODY.size, NFQA_VERDICT_HDR))


def verdict(queue: int, packet_id: int, code: int) -> bytes:
    return verdict_prefix(queue) + _VERDICT_BODY.pack(code, packet_id)


def parse_messages(buf, n: int):
    """Yield ``(type, offset, length)`` for each netlink message in ``buf[:n]``."""
    off = 0
    while off + _NLMSGHDR.size <= n:
        length, kind = struct.unpack_from("=IH", buf, off)
        if length < _NLMSGHDR.size or off + length > n:
            return
        yield kind, off, length
        off += _align(length)


def parse_packet(buf, off: int, length: int) -> tuple[int, int]:
    """``(packet id, original packet length)`` of an NFQNL_MSG_PACKET message; the length is
    NFQA_CAP_LEN when the copy was cut short, else the payload's length (0 without one)."""
    end = off + length
    pos = off + _HDR_LEN
    packet_id = -1
    payload_len = cap_len = 0
    while pos + 4 <= end:
        alen, akind = _NLATTR.unpack_from(buf, pos)
        if alen < 4:
            break
        akind &= NLA_TYPE_MASK
        if akind == NFQA_PACKET_HDR:
            packet_id = struct.unpack_from(">I", buf, pos + 4)[0]
        elif akind == NFQA_PAYLOAD:
            payload_len = alen - 4
        elif akind == NFQA_CAP_LEN:
            cap_len = struct.unpack_from(">I", buf, pos + 4)[0]
        pos += _align(alen)
    return packet_id, cap_len or payload_len


def parse_error(buf, off: int) -> int:
    """The (negative) errno of an NLMSG_ERROR message; 0 for an ack."""
    return struct.unpack_from("=i", buf, off + _NLMSGHDR.size)[0]


class QueueBindError(RuntimeError):
    """A queue could not be bound (e.g. another process holds it)."""


@dataclass
class QueueSocket:
    """A netlink socket bound to one NFQUEUE in the namespace it was created in.

    Create it inside the namespace (see ``topology.netns.entered``); after ``bind`` it is
    non-blocking and may be used from anywhere."""

    queue: int
    copy_range: int = 64
    maxlen: int = 20000
    rcvbuf: int = 16 << 20
    sock: socket.socket | None = field(default=None, init=False)

    def bind(self, timeout: float = 2.0) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, self.rcvbuf)
            sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
            sock.bind((0, 0))
            for msg in config_messages(self.queue, copy_range=self.copy_range, maxlen=self.maxlen):
                sock.send(msg)
                err = self._wait_ack(sock, timeout)
                if err:
                    hint = (" (another process holds this queue: a leftover engine?)"
                            if err in (errno.EBUSY, errno.EPERM) else "")
                    raise QueueBindError(f"binding NFQUEUE {self.queue}: "
                                         f"{os.strerror(err)}{hint}")
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    @staticmethod
    def _wait_ack(sock: socket.socket, timeout: float) -> int:
        buf = bytearray(8192)
        while True:
            ready, _, _ = select.select([sock], [], [], timeout)
            if not ready:
                return errno.ETIMEDOUT
            n = sock.recv_into(buf)
            for kind, off, _ in parse_messages(buf, n):
                if kind == NLMSG_ERROR:
                    return -parse_error(buf, off)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self, unbind: bool = True) -> None:
        """Unbind and close. Packets still held by the kernel for this queue are dropped."""
        if self.sock is None:
            return
        try:
            if unbind:
                self.sock.send(unbind_message(self.queue))
        except OSError:
            pass
        finally:
            self.sock.close()
            self.sock = None
