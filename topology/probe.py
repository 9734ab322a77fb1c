"""A UDP probe for calibration: one-way delay, jitter and loss of one path.

The sender stamps each datagram with its sequence number and CLOCK_MONOTONIC (one clock for
every namespace of the machine, so sender and receiver compare directly; CLOCK_REALTIME gave
values below the configured delay here). The receiver takes its own timestamp in user space
(``ping`` timestamps in the kernel before PREROUTING and would not see ingress delay).

    python -m topology.probe recv --port P --count N --timeout S   # prints JSON
    python -m topology.probe send --to HOST:PORT --count N --rate R
"""
from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time

_HEADER = struct.Struct("!IQ")  # sequence, send time (ns, CLOCK_MONOTONIC)


def send(host: str, port: int, count: int, rate: float, size: int = 200) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    buf = bytearray(size)
    start = time.monotonic()
    for seq in range(count):
        due = start + seq / rate
        while (now := time.monotonic()) < due:
            time.sleep(min(due - now, 0.002))
        _HEADER.pack_into(buf, 0, seq, time.monotonic_ns())
        sock.sendto(buf, (host, port))
    sock.close()


def receive(port: int, count: int, timeout: float) -> dict:
    """Wait for ``count`` datagrams or until ``timeout`` passes without one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(("0.0.0.0", port))
    sock.settimeout(timeout)
    delays: dict[int, float] = {}
    order: list[int] = []
    print("ready", flush=True, file=sys.stderr)
    while len(delays) < count:
        try:
            data = sock.recv(2048)
        except TimeoutError:
            break
        now = time.monotonic_ns()
        seq, sent = _HEADER.unpack_from(data)
        if seq not in delays:
            delays[seq] = (now - sent) / 1e6
            order.append(seq)
    sock.close()
    return {"count": count, "received": len(delays),
            "delays_ms": [delays[s] for s in sorted(delays)],
            "sequence": sorted(delays), "arrival_order": order}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m topology.probe")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--count", type=int, required=True)
    r.add_argument("--timeout", type=float, default=2.0)
    s = sub.add_parser("send")
    s.add_argument("--to", required=True)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--rate", type=float, default=100.0)
    args = p.parse_args(argv)
    if args.cmd == "recv":
        print(json.dumps(receive(args.port, args.count, args.timeout)))
    else:
        host, port = args.to.rsplit(":", 1)
        send(host, int(port), args.count, args.rate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
