"""relay-conntrack: keep the relay's published UDP port reachable across relay container restarts.

Docker publishes the relay's UDP port with a DNAT rule that exists only while the relay
container runs. A client datagram that reaches the published address while the container is
down (a restart, a crash) creates a conntrack entry WITHOUT that NAT; the call's own packets
(RTP every 20 ms) keep refreshing it, so it outlives the restart and every later packet of that
flow follows it to nowhere: the call hears nothing until it calls again.

This guard runs in the host's network namespace (compose: ``network_mode: host``,
``cap_add: [NET_ADMIN]``) and deletes the conntrack entries for UDP to ``public_host:port``
that are not NATed to the relay's container IP: those the DNAT did not rewrite at all (their
reply comes from the address the client sent to). The flow's next datagram then gets a fresh
entry, NATed to the relay again (same client address and port), and the new relay finds the
flow in Redis: media resumes on the same call.

How it watches, cheaply:
  * ``conntrack -E -e NEW`` (one process, asleep in the kernel until a new entry for the port
    appears) wakes it when an entry is created without the NAT;
  * awake, it lists the port's entries every ``interval`` s and deletes the un-NATed ones until
    a listing finds none (while the relay is still down they come back at the next datagram,
    which is harmless; the first listing after the DNAT rule is back clears them for good);
  * every ``sweep`` s it lists them anyway, should an event have been lost.

Scope: IPv4, UDP, original destination port ``port`` and address ``public_host`` (any local
address when it is 0.0.0.0), reply source that very address and port (no NAT), not
``relay_ip``; what wakes it must also be unanswered ([UNREPLIED]). An entry NATed to anything
is never touched, nor is any other port, protocol or address.

Cost, measured: idle, a listing every ``sweep`` s (about 10.8 ms of CPU each: fork, exec,
netlink dump), 0.12 % of a core; polling every 0.2 s all the time would be 5 %.

    python conntrack_guard.py --port 3478 --public-host 127.0.0.1 --relay-ip 172.30.15.10
"""
from __future__ import annotations

import argparse
import functools
import ipaddress
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, NamedTuple

log = logging.getLogger("relay-conntrack")


@dataclass(frozen=True)
class GuardConfig:
    port: int = 3478                 # the relay's published UDP port on the host
    public_host: str = "127.0.0.1"   # the address it is published on; 0.0.0.0: every local one
    relay_ip: str = "172.30.15.10"   # the relay container's address: the DNAT's target
    interval: float = 0.2            # seconds between two listings while un-NATed entries exist
    sweep: float = 10.0              # seconds between two listings otherwise (lost events)
    conntrack: str = "conntrack"     # the conntrack tool (Debian's package `conntrack`)

    @property
    def any_address(self) -> bool:
        return self.public_host in ("", "0.0.0.0")

    def selector(self) -> list[str]:
        """conntrack options selecting the published port's entries (IPv4, UDP)."""
        args = ["-f", "ipv4", "-p", "udp", "--orig-port-dst", str(self.port)]
        return args if self.any_address else args + ["--orig-dst", self.public_host]


class Entry(NamedTuple):
    """A conntrack entry: its original tuple, its reply direction's source, and whether a
    reply has been seen (conntrack shows [UNREPLIED] until one is)."""
    src: str
    sport: int
    dst: str
    dport: int
    reply_src: str
    reply_sport: int
    replied: bool


def parse(lines: Iterable[str]) -> Iterator[Entry]:
    """Entries from `conntrack -L` or `conntrack -E` lines (`[NEW] udp 17 30 src=.. dst=..
    sport=.. dport=.. [UNREPLIED] src=.. ...`): the first src/dst/sport/dport are the original
    direction, the second src the reply's. Lines of other protocols or shapes are skipped."""
    for line in lines:
        fields = line.split()
        if fields[:1] and fields[0].startswith("["):
            fields = fields[1:]
        if not fields or fields[0] != "udp":
            continue
        seen: dict[str, list[str]] = {}
        for f in fields:
            key, sep, value = f.partition("=")
            if sep and key in ("src", "dst", "sport", "dport"):
                seen.setdefault(key, []).append(value)
        try:
            yield Entry(seen["src"][0], int(seen["sport"][0]), seen["dst"][0],
                        int(seen["dport"][0]), seen["src"][1], int(seen["sport"][1]),
                        "[UNREPLIED]" not in fields)
        except (KeyError, IndexError, ValueError):
            continue


@functools.lru_cache(maxsize=256)
def is_local(address: str) -> bool:
    """Whether `address` is one of this namespace's own (only those can be the published one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


class Guard:
    def __init__(self, cfg: GuardConfig):
        self.cfg = cfg
        self.wake = threading.Event()      # set by an un-NATed NEW event, or by a signal
        self.stopping = False
        self.events: subprocess.Popen | None = None
        self.listings = self.deleted = self.episodes = 0

    # ---------------------------------------------------------------- what is stale
    def is_stale(self, e: Entry) -> bool:
        """To the published address and port, not NATed (the reply would come from the address
        the client sent to, not from the relay) and never answered. A local socket that answers
        on the port (Docker's userland proxy, if the daemon runs with one) makes such entries
        replied, and they are left alone."""
        cfg = self.cfg
        return (e.dport == cfg.port and not e.replied
                and e.reply_src == e.dst and e.reply_sport == e.dport
                and e.reply_src != cfg.relay_ip
                and (is_local(e.dst) if cfg.any_address else e.dst == cfg.public_host))

    def conntrack(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.cfg.conntrack, *args], capture_output=True, text=True,
                              timeout=10)

    def stale(self) -> list[Entry]:
        r = self.conntrack("-L", *self.cfg.selector())
        self.listings += 1
        if r.returncode != 0:
            raise RuntimeError(f"conntrack -L: exit {r.returncode}: {r.stderr.strip()[:200]}")
        return [e for e in parse(r.stdout.splitlines()) if self.is_stale(e)]

    def delete(self, stale: list[Entry]) -> int:
        """Delete the un-NATed entries: one `conntrack -D` per destination address (however many
        calls), matching UDP, the port, that address and a reply source (address and port)
        equal to it (no NAT happened), so an entry NATed to the relay, or to anything else, is
        never matched. (An un-NATed entry that was answered, which only a userland proxy makes,
        goes too: its next datagram makes the same entry again.) Returns how many went."""
        n = 0
        for dst in sorted({e.dst for e in stale}):
            r = self.conntrack("-D", "-f", "ipv4", "-p", "udp",
                               "--orig-port-dst", str(self.cfg.port), "--orig-dst", dst,
                               "--reply-src", dst,
                               "--reply-port-src", str(self.cfg.port))
            # "N flow entries have been deleted." (exit 1 when N is 0: they went meanwhile)
            words = r.stderr.split(":")[-1].split()
            n += int(words[0]) if words and words[0].isdigit() else 0
        return n

    # ---------------------------------------------------------------- the loop
    def episode(self, stale: list[Entry]) -> None:
        """Un-NATed entries exist: delete them every `interval` until a listing finds none."""
        cfg, start, deleted = self.cfg, time.monotonic(), 0
        self.episodes += 1
        log.info("un-NATed entries to %s:%d (no DNAT to the relay when they were created): "
                 "%s; deleting",
                 stale[0].dst, cfg.port,
                 ", ".join(f"{e.src}:{e.sport} (reply from {e.reply_src})" for e in stale[:6])
                 + (f" and {len(stale) - 6} more" if len(stale) > 6 else ""))
        while stale and not self.stopping:
            deleted += self.delete(stale)
            time.sleep(cfg.interval)
            stale = self.stale()
        self.deleted += deleted
        log.info("clear after %.2f s: %d entries deleted; the port's entries are NATed to %s again",
                 time.monotonic() - start, deleted, cfg.relay_ip)

    def start_events(self) -> None:
        self.events = subprocess.Popen(
            [self.cfg.conntrack, "-E", "-e", "NEW", *self.cfg.selector()],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        threading.Thread(target=self.read_events, name="events", daemon=True).start()

    def read_events(self) -> None:
        assert self.events and self.events.stdout
        for e in parse(self.events.stdout):
            if self.is_stale(e):
                self.wake.set()
        self.events.wait()
        self.wake.set()   # the loop reports it (not here: a failed start has its own one line)

    def serve(self) -> int:
        cfg = self.cfg
        try:
            self.start_events()    # first, so that no entry falls between listing and events
            stale = self.stale()   # fails fast without NET_ADMIN or without the tool
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            log.error("cannot read the conntrack table: %s", exc)
            return 1
        log.info("watching UDP to %s:%d: entries not NATed to %s are deleted (every %.2f s while "
                 "they exist; woken by conntrack events; a sweep every %.0f s)",
                 "<any local address>" if cfg.any_address else cfg.public_host, cfg.port,
                 cfg.relay_ip, cfg.interval, cfg.sweep)
        failures = 0
        while not self.stopping:
            try:
                if stale:
                    self.episode(stale)
                self.wake.wait(cfg.sweep)
                self.wake.clear()
                if self.stopping:
                    break
                if self.events and self.events.poll() is not None:
                    # no more events: exit, and let the restart policy start it again
                    log.error("conntrack -E ended (exit %s)", self.events.returncode)
                    return 1
                stale = self.stale()
                failures = 0
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                failures, stale = failures + 1, []
                log.warning("conntrack failed (%d in a row): %s", failures, exc)
                if failures >= 10:
                    return 1
                self.wake.set()   # list again after a pause, not after a whole sweep
                time.sleep(cfg.interval)
        return 0

    def stop(self, *_: object) -> None:
        self.stopping = True
        self.wake.set()

    def close(self) -> None:
        if self.events and self.events.poll() is None:
            self.events.terminate()
            try:
                self.events.wait(2)
            except subprocess.TimeoutExpired:
                self.events.kill()
        log.info("stopped: %d listings, %d episodes, %d entries deleted",
                 self.listings, self.episodes, self.deleted)


def config_from(argv: list[str] | None = None) -> GuardConfig:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=int(env("VOICEEDGE_RELAY_PORT", "3478")))
    p.add_argument("--public-host", default=env("VOICEEDGE_PUBLIC_HOST", "127.0.0.1"),
                   help="the address the port is published on (0.0.0.0: any local address)")
    p.add_argument("--relay-ip", default="172.30.15.10", help="the relay container's address")
    p.add_argument("--interval", type=float, default=GuardConfig.interval)
    p.add_argument("--sweep", type=float, default=GuardConfig.sweep)
    p.add_argument("--conntrack", default=shutil.which("conntrack") or "/usr/sbin/conntrack")
    a = p.parse_args(argv)
    try:   # addresses, not host names: conntrack shows and matches IPs
        for value in (a.public_host or "0.0.0.0", a.relay_ip):
            ipaddress.IPv4Address(value)
    except ValueError as exc:
        p.error(str(exc))
    if not 0 < a.port < 65536 or a.interval <= 0 or a.sweep <= 0:
        p.error("--port must be 1-65535, --interval and --sweep positive")
    return GuardConfig(a.port, a.public_host, a.relay_ip, a.interval, a.sweep, a.conntrack)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    guard = Guard(config_from(argv))
    signal.signal(signal.SIGTERM, guard.stop)
    signal.signal(signal.SIGINT, guard.stop)
    try:
        return guard.serve()
    finally:
        guard.close()


if __name__ == "__main__":
    sys.exit(main())
