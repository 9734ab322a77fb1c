"""The userspace impairment engine: one process, one timing thread, every queue of every
namespace.

Run as ``python -m topology.impairment.engine``; ``UserspaceBackend`` drives it over a pipe,
one JSON object per line each way:

- the engine first writes ``{"ok": true, "ready": true, "pid": PID, "realtime": P}`` (P: the
  SCHED_FIFO priority it runs at, 0 for none);
- ``{"op": "add", "label": L, "ns_path": P, "queue": N, "impairment": {...}, "seed": S}``
  binds NFQUEUE ``N`` inside namespace ``P`` and answers ``{"ok": true}`` or
  ``{"ok": false, "error": "..."}``; only then may an iptables rule feed that queue;
- ``{"op": "set", "label": L, "impairment": {...}}`` replaces the impairment of queue ``L``
  from the next packet on; packets it holds keep their release times. Drops while a queue runs
  an impairment other than the one it was added with count as ``dropped_fault``, not
  ``dropped_loss``;
- ``{"op": "stats"}`` answers ``{"ok": true, "stats": {...}}``;
- ``{"op": "stop"}``, SIGTERM or the end of its input: release every held packet at once
  (ACCEPT), unbind every queue, exit 0.

The loop: ``select`` over the netlink sockets, the control pipe and a signalfd, with a
timeout up to the earliest release time in a heap of ``(release, queue, packet id)``. Packets
stay in the kernel; only their ids come up (with a 64-byte prefix and the length). Verdicts
go out in any order, batched per socket.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import heapq
import json
import os
import random
import resource
import select
import signal
import struct
import sys
import time
import traceback
from dataclasses import dataclass, field

from topology.impairment import nfqueue as nfq
from topology.impairment.direction import Direction
from topology.impairment.model import Impairment, impairment_from_dict
from topology.netns import entered
from topology.realtime import try_realtime

PYTHON, NATIVE = "python", "native"
CORES = (NATIVE, PYTHON)


def check_core(name: str) -> str:
    """``name`` if it is one of CORES, else ValueError saying which there are."""
    if name not in CORES:
        raise ValueError(f"unknown engine core {name!r} (choose from {', '.join(CORES)})")
    return name


PR_SET_TIMERSLACK = 29
IDLE_TIMEOUT = 0.5  # seconds; nothing is due, wake up now and then anyway
RECV_BURST = 256  # packets read from one socket before releasing what is due
SEND_CHUNK = 256  # verdicts per send
LATENESS_BUCKETS = 20_000  # 1 us buckets; beyond 20 ms goes into the last one
# A release this late puts the path's delay off by more than calibration allows (max(1 ms, 5%)
# per hop). A second is reported as lagged when at least LAGGED_SHARE of its releases were that
# late (the engine could not keep up), or one was LAGGED_STALL_S late (services/lag.py's rule).
LAGGED_S = 0.002
LAGGED_SHARE = 0.10
LAGGED_STALL_S = 0.100
MAX_LAGGED_SECONDS = 100_000

_ID_AT = 24  # NFQA_PACKET_HDR is always the first attribute: its packet id's offset
_PACKET_ID = struct.Struct(">I")
_NLHDR = struct.Struct("=IH")
_VERDICT_BODY = struct.Struct(">II")


def histogram_percentile(buckets, frac: float, count: int) -> float | None:
    """The value at ``frac`` of ``count`` samples in a histogram given as (value, samples)
    pairs in rising order (the lateness histogram, or a window of it); None when empty."""
    acc = 0
    for value, n in buckets:
        acc += n
        if count and acc >= frac * count:
            return float(value)
    return None


@dataclass
class BoundQueue:
    """One impaired direction: its queue socket, its decisions, its counters."""

    index: int
    label: str
    queue: int
    ns_path: str
    direction: Direction
    sock: nfq.QueueSocket
    prefix: bytes
    kernel_fd: int | None  # /proc/net/netfilter/nfnetlink_queue of its namespace
    configured: Impairment | None = None  # the impairment it was added with
    fault: bool = False  # a changed impairment is in force ("set" to other than configured)
    changes: int = 0
    seen: int = 0
    dropped: int = 0  # losses under the configured impairment
    dropped_fault: int = 0  # losses while ``fault``
    released: int = 0
    out: list = field(default_factory=list)  # verdicts waiting to be sent

    def flush(self) -> None:
        out = self.out
        for i in range(0, len(out), SEND_CHUNK):
            self.sock.sock.send(b"".join(out[i:i + SEND_CHUNK]))
        out.clear()

    def kernel_counters(self) -> dict:
        """This queue's line of the kernel's table (drops there mean the queue or the socket
        overflowed)."""
        if self.kernel_fd is None:
            return {}
        for line in os.pread(self.kernel_fd, 1 << 16, 0).decode().splitlines():
            f = line.split()
            if len(f) >= 8 and int(f[0]) == self.queue:
                return {"queue_total": int(f[2]), "queue_dropped": int(f[5]),
                        "user_dropped": int(f[6]), "id_sequence": int(f[7])}
        return {}


class Engine:
    """The timing loop and its queues."""

    def __init__(self, control_in: int, control_out: int, spin_us: float = 0.0) -> None:
        self.spin = spin_us / 1e6
        self.control_in = control_in
        self.control_out = control_out
        self.queues: list[BoundQueue] = []
        self.by_fd: dict[int, BoundQueue] = {}
        self.by_label: dict[str, BoundQueue] = {}
        self.heap: list[tuple[float, int, int]] = []
        self.lateness = [0] * (LATENESS_BUCKETS + 1)
        self.late_max = 0.0
        # Wall-clock seconds in which a release was LAGGED_S or more late -> the worst: the
        # runner flags the sessions live then (the engine is on every impaired path).
        self.lagged: dict[int, float] = {}
        self._unix_offset = time.time() - time.monotonic()
        self._second, self._second_n, self._second_late, self._second_max = None, 0, 0, 0.0
        self.verdict_errors = 0
        self.started = time.monotonic()
        self._stopping = False
        self._control_buf = b""
        self._buf = bytearray(1 << 16)
        self._sigfd = _signalfd((signal.SIGTERM, signal.SIGINT))
        self._fds = [control_in, self._sigfd]

    # -- control ------------------------------------------------------------------------------

    def reply(self, obj: dict) -> None:
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(self.control_out, data):]

    def add(self, spec: dict) -> None:
        imp = impairment_from_dict(spec["impairment"])
        rng = random.Random(spec.get("seed"))
        qsock = nfq.QueueSocket(int(spec["queue"]))
        kernel_fd = None
        with entered(spec["ns_path"]):
            qsock.bind()
            try:
                kernel_fd = os.open("/proc/thread-self/net/netfilter/nfnetlink_queue", os.O_RDONLY)
            except OSError:
                pass
        q = BoundQueue(index=len(self.queues), label=spec["label"], queue=qsock.queue,
                       ns_path=spec["ns_path"], direction=Direction(imp, rng), sock=qsock,
                       prefix=nfq.verdict_prefix(qsock.queue), kernel_fd=kernel_fd,
                       configured=imp)
        self.queues.append(q)
        self.by_fd[qsock.fileno()] = q
        self.by_label[q.label] = q
        self._fds.append(qsock.fileno())

    def set(self, spec: dict) -> None:
        """Replace a queue's impairment; what the heap holds is untouched."""
        q = self.by_label.get(spec["label"])
        if q is None:
            raise ValueError(f"no queue labelled {spec['label']!r}")
        imp = impairment_from_dict(spec["impairment"])
        q.direction = q.direction.changed(imp)
        q.fault = imp != q.configured
        q.changes += 1

    def stats(self) -> dict:
        return self._stats_reply(
            PYTHON, [(us, n) for us, n in enumerate(self.lateness) if n], self.late_max,
            {**self.lagged, **self._open_second()}, self.verdict_errors,
            [(q.seen, q.dropped, q.dropped_fault, q.released, q.fault) for q in self.queues])

    def _stats_reply(self, core: str, hist: list[tuple[int, int]], late_max: float,
                     lagged: dict[int, float], verdict_errors: int, counts: list[tuple],
                     **extra) -> dict:
        """The ``stats`` answer: ``hist`` the 1-us lateness buckets that are not empty, in
        order; ``counts`` per queue (seen, dropped_loss, dropped_fault, delayed, fault)."""
        ru = resource.getrusage(resource.RUSAGE_SELF)
        count = sum(n for _, n in hist)
        queues = {}
        for q, (seen, dropped, dropped_fault, delayed, fault) in zip(self.queues, counts):
            queues[q.label] = {"queue": q.queue, "seen": seen, "dropped_loss": dropped,
                               "dropped_fault": dropped_fault, "delayed": delayed,
                               "held": seen - dropped - dropped_fault - delayed,
                               "fault": fault, "changes": q.changes,
                               "kernel": q.kernel_counters()}
        return {
            "pid": os.getpid(),
            "core": core,
            "uptime_s": round(time.monotonic() - self.started, 3),
            "cpu_seconds": ru.ru_utime + ru.ru_stime,
            "lateness_us": {"count": count,
                            "p50": histogram_percentile(hist, 0.50, count),
                            "p99": histogram_percentile(hist, 0.99, count),
                            "max": round(late_max * 1e6, 1),
                            # sparse 1-us histogram: callers diff two snapshots for a window
                            "hist": {str(us): n for us, n in hist}},
            "lagged_seconds": {str(k): round(v * 1e3, 2) for k, v in sorted(lagged.items())},
            "verdict_errors": verdict_errors,
            **extra,
            "queues": queues,
        }

    def _on_control(self) -> None:
        try:
            data = os.read(self.control_in, 1 << 16)
        except BlockingIOError:
            return
        if not data:  # the backend is gone: nobody will stop us otherwise
            self._stop("end of input")
            return
        self._control_buf += data
        while b"\n" in self._control_buf:
            line, self._control_buf = self._control_buf.split(b"\n", 1)
            if line.strip():
                self._command(json.loads(line))

    def _command(self, cmd: dict) -> None:
        op = cmd.get("op")
        try:
            if op == "add":
                self.add(cmd)
                self.reply({"ok": True})
            elif op == "set":
                self.set(cmd)
                self.reply({"ok": True})
            elif op == "stats":
                self.reply({"ok": True, "stats": self.stats()})
            elif op == "stop":
                self._stop("asked to")
                self.reply({"ok": True})
            else:
                self.reply({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as exc:  # reported to the backend, which raises it there
            self.reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})

    # -- the timing loop ------------------------------------------------------------------------

    def _on_packets(self, q: BoundQueue) -> None:
        buf, heap, sock = self._buf, self.heap, q.sock.sock
        decide, index = q.direction.decide, q.index
        with_length = q.direction.needs_length
        for _ in range(RECV_BURST):
            try:
                n = sock.recv_into(buf)
            except BlockingIOError:
                break
            now = time.monotonic()
            off = 0
            while off + 16 <= n:
                length, kind = _NLHDR.unpack_from(buf, off)
                if length < 16:
                    break
                if kind == nfq.NFQNL_MSG_PACKET:
                    if with_length:
                        pid, plen = nfq.parse_packet(buf, off, length)
                    else:
                        pid, plen = _PACKET_ID.unpack_from(buf, off + _ID_AT)[0], 0
                    q.seen += 1
                    due = decide(now, plen)
                    if due is None:
                        if q.fault:
                            q.dropped_fault += 1
                        else:
                            q.dropped += 1
                        q.out.append(q.prefix + _VERDICT_BODY.pack(nfq.NF_DROP, pid))
                    else:
                        heapq.heappush(heap, (due, index, pid))
                elif kind == nfq.NLMSG_ERROR and nfq.parse_error(buf, off):
                    self.verdict_errors += 1
                off += (length + 3) & ~3
        if q.out:
            q.flush()

    def _release(self, now: float) -> None:
        heap, queues, hist = self.heap, self.queues, self.lateness
        touched = set()
        while heap and heap[0][0] <= now:
            due, index, pid = heapq.heappop(heap)
            q = queues[index]
            q.out.append(q.prefix + _VERDICT_BODY.pack(nfq.NF_ACCEPT, pid))
            q.released += 1
            touched.add(index)
            late = now - due
            if late > self.late_max:
                self.late_max = late
            second = int(now + self._unix_offset)
            if second != self._second:
                self._close_second()
                self._second, self._second_n, self._second_late, self._second_max = \
                    second, 0, 0, 0.0
            self._second_n += 1
            self._second_late += late >= LAGGED_S
            if late > self._second_max:
                self._second_max = late
            hist[min(int(late * 1e6), LATENESS_BUCKETS)] += 1
        for index in touched:
            queues[index].flush()

    def _open_second(self) -> dict[int, float]:
        """The second in progress, {second: worst} if it has lagged so far."""
        n, late, worst = self._second_n, self._second_late, self._second_max
        if self._second is None or not n:
            return {}
        if worst >= LAGGED_STALL_S or late / n >= LAGGED_SHARE:
            return {self._second: worst}
        return {}

    def _close_second(self) -> None:
        if len(self.lagged) < MAX_LAGGED_SECONDS:
            self.lagged.update(self._open_second())

    def run(self) -> None:
        heap, spin = self.heap, self.spin
        monotonic, sel = time.monotonic, select.select
        while not self._stopping:
            timeout = IDLE_TIMEOUT
            if heap:
                now = monotonic()
                due = heap[0][0]
                if due - now <= spin:
                    # Waking from idle costs tens of us; the last stretch is spent awake.
                    while now < due:
                        now = monotonic()
                    self._release(now)
                if heap:
                    timeout = min(max(heap[0][0] - monotonic() - spin, 0.0), IDLE_TIMEOUT)
            readable = sel(self._fds, [], [], timeout)[0]
            for fd in readable:
                q = self.by_fd.get(fd)
                if q is not None:
                    self._on_packets(q)
                elif fd == self.control_in:
                    self._on_control()
                elif fd == self._sigfd:
                    self._on_signal()

    def _stop(self, why: str) -> None:
        print(f"impairment engine {os.getpid()}: stopping ({why})", file=sys.stderr, flush=True)
        self._stopping = True

    def shutdown(self) -> None:
        """Accept everything still held (stopping must not lose packets), then unbind."""
        while self.heap:
            _, index, pid = heapq.heappop(self.heap)
            q = self.queues[index]
            q.out.append(q.prefix + _VERDICT_BODY.pack(nfq.NF_ACCEPT, pid))
        for q in self.queues:
            try:
                q.flush()
            except OSError:
                pass
            q.sock.close()
            if q.kernel_fd is not None:
                os.close(q.kernel_fd)

    def _on_signal(self) -> None:
        info = os.read(self._sigfd, 128)  # struct signalfd_siginfo
        signo, _, _, sender = struct.unpack_from("=IiiI", info)
        if signo == signal.SIGINT:
            return  # Ctrl-C reaches the backend too, which stops us in order
        try:
            with open(f"/proc/{sender}/cmdline", "rb") as f:
                who = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            who = "?"
        self._stop(f"{signal.Signals(signo).name} from pid {sender}: {who[:200]}")


class NativeEngine(Engine):
    """The same engine with its per-packet work in C (``_engine.Core``): reads, decisions, the
    heap and verdicts; the control protocol, binding and signals stay here."""

    def __init__(self, control_in: int, control_out: int, spin_us: float = 0.0,
                 tick_us: float = 0.0) -> None:
        from topology.impairment._engine import Core

        super().__init__(control_in, control_out, spin_us)
        self.core = Core(buckets=LATENESS_BUCKETS, lagged_s=LAGGED_S, lagged_share=LAGGED_SHARE,
                         lagged_stall_s=LAGGED_STALL_S, unix_offset=self._unix_offset,
                         spin_s=self.spin, tick_s=tick_us / 1e6)

    def add(self, spec: dict) -> None:
        super().add(spec)
        q = self.queues[-1]
        self.core.add(q.sock.fileno(), q.queue, q.direction.params(), q.direction.random_state())

    def set(self, spec: dict) -> None:
        super().set(spec)
        q = self.by_label[spec["label"]]
        self.core.set(q.index, q.direction.params(), q.fault)

    def run(self) -> None:
        python_fds = (self.control_in, self._sigfd)
        while not self._stopping:
            for fd in self.core.run(python_fds, IDLE_TIMEOUT):
                if fd == self.control_in:
                    self._on_control()
                elif fd == self._sigfd:
                    self._on_signal()

    def stats(self) -> dict:
        core = self.core.stats()
        return self._stats_reply(NATIVE, sorted(core["hist"].items()), core["late_max_s"],
                                 core["lagged"], core["verdict_errors"], core["queues"],
                                 malformed=core["malformed"], truncated=core["truncated"],
                                 early_max_us=round(core["early_max_s"] * 1e6, 1),
                                 ticks=core["ticks"])

    def shutdown(self) -> None:
        self.core.shutdown()
        for q in self.queues:
            q.sock.close()
            if q.kernel_fd is not None:
                os.close(q.kernel_fd)


def _signalfd(signums) -> int:
    """A file descriptor that becomes readable when one of ``signums`` arrives (they are
    blocked, so they do nothing else); what it reads says who sent the signal."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    mask = bytearray(128)  # sigset_t
    for n in signums:
        mask[(n - 1) // 8] |= 1 << ((n - 1) % 8)
    libc = ctypes.CDLL(None, use_errno=True)
    buf = (ctypes.c_char * len(mask)).from_buffer(mask)
    fd = libc.signalfd(-1, buf, os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "signalfd")
    return fd


def _set_timer_slack(ns: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0)


def main() -> int:
    _set_timer_slack(1000)
    parser = argparse.ArgumentParser(prog="python -m topology.impairment.engine")
    parser.add_argument("--spin-us", type=float, default=0.0,
                        help="wake this early for a release and wait the rest awake")
    parser.add_argument("--tick-us", type=float, default=0.0,
                        help="native core: while packets arrive within this of each other, "
                             "read and release on a tick of this period (0: on every event)")
    parser.add_argument("--realtime", type=int, default=0, metavar="PRIO",
                        help="run at SCHED_FIFO priority PRIO (0: ordinary scheduling), so the "
                             "emulated links do not wait for the emulated hosts; refused "
                             "(no root or CAP_SYS_NICE) it runs ordinary and says so")
    parser.add_argument("--core", choices=CORES, default=NATIVE,
                        help="where the per-packet work runs: C (native, the default) or the "
                             "Python reference (python)")
    args = parser.parse_args()
    if args.tick_us < 0 or args.tick_us > 10000 or (args.tick_us and args.core != NATIVE):
        parser.error("--tick-us is 0..10000 and needs the native core")
    low, high = os.sched_get_priority_min(os.SCHED_FIFO), os.sched_get_priority_max(os.SCHED_FIFO)
    if args.realtime and not low <= args.realtime <= high:
        parser.error(f"--realtime is 0 or a real-time priority ({low}-{high})")
    # it sleeps whenever nothing is due; the kernel's real-time throttling still bounds it
    realtime = try_realtime(args.realtime) if args.realtime else 0
    if args.core == NATIVE:
        engine = NativeEngine(sys.stdin.fileno(), sys.stdout.fileno(), spin_us=args.spin_us,
                              tick_us=args.tick_us)
    else:
        engine = Engine(sys.stdin.fileno(), sys.stdout.fileno(), spin_us=args.spin_us)
    os.set_blocking(engine.control_in, False)
    gc.freeze()  # what exists now is never garbage; keep collections short
    try:
        engine.reply({"ok": True, "ready": True, "pid": os.getpid(), "realtime": realtime})
        engine.run()
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
