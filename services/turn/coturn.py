"""One coturn TURN server (Debian's ``turnserver``): its configuration file and readiness.

``config_text`` writes everything as a coturn configuration file (the shared secret must not be
on a command line, where ``ps`` shows it to every user): the file is created 0600 and coturn
reads it with ``turnserver -c FILE``, and no other configuration (not /etc/turnserver.conf).

What is set, and why:

- ``listening-ip`` = ``relay-ip`` = the given address, ``listening-port`` 3478: clients and
  peers see one address; relay ports from ``relay_ports`` (one per allocation);
- ``use-auth-secret`` + ``static-auth-secret`` + ``realm``: the TURN REST API credentials
  (services/turn/credentials.py); ``fingerprint`` on every message;
- UDP only: no TLS/DTLS listeners, no TCP listener, no TCP relays; no telnet CLI, no RFC 5780
  NAT discovery (its second port), STUN answers without the old MAPPED-ADDRESS;
- peers: coturn 4.6.1 refuses loopback peers (unless ``allow-loopback-peers``) and, with
  ``no-multicast-peers``, multicast; it refuses no private range by default, and production
  configurations deny 10.0.0.0/8 and the other RFC 1918 ranges. This world's public internet
  *is* 10.x, so those lines would break it; instead, when ``peers`` is given, every address is
  denied except those peers (the edge's media servers): not an open relay. coturn checks its
  allow list before its deny list;
- its pid file and (unused, but always opened) SQLite user database in ``workdir``, not in
  /var; its log to stdout (ISO timestamps, ``verbose``: one line per allocation, permission,
  channel and refresh).
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from services.turn.credentials import read_secret
from services.wire.stun import MAGIC_COOKIE

DEFAULT_PORT = 3478
DEFAULT_RELAY_PORTS = (49152, 49999)
DEFAULT_REALM = "voiceedge"
_BINDING_REQUEST, _BINDING_SUCCESS = 0x0001, 0x0101


@dataclass(frozen=True)
class TurnServerConfig:
    address: str                           # listening and relay IP
    secret_file: Path                      # the shared secret (the front reads the same file)
    workdir: Path                          # pid file and SQLite database
    name: str = "turn"                     # file names in workdir
    port: int = DEFAULT_PORT
    relay_ports: tuple[int, int] = DEFAULT_RELAY_PORTS
    realm: str = DEFAULT_REALM
    peers: tuple[str, ...] = ()            # addresses or "A-B" ranges it relays to; (): any
    verbose: bool = True

    def __post_init__(self) -> None:
        ipaddress.IPv4Address(self.address)
        low, high = self.relay_ports
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"relay ports {low}-{high}: a range within 1024-65535")
        for peer in self.peers:
            for end in peer.split("-"):
                ipaddress.IPv4Address(end)

    @property
    def url(self) -> str:
        """The ICE server URL a client is given (RFC 7065)."""
        return f"turn:{self.address}:{self.port}?transport=udp"


def _loopback(peer: str) -> bool:
    return any(ipaddress.IPv4Address(end).is_loopback for end in peer.split("-"))


def config_text(cfg: TurnServerConfig) -> str:
    """coturn's configuration file for ``cfg`` (holds the secret)."""
    low, high = cfg.relay_ports
    lines = [f"listening-ip={cfg.address}", f"relay-ip={cfg.address}",
             f"listening-port={cfg.port}", f"min-port={low}", f"max-port={high}",
             "use-auth-secret", f"static-auth-secret={read_secret(cfg.secret_file)}",
             f"realm={cfg.realm}", "fingerprint",
             "no-tls", "no-dtls", "no-tcp", "no-tcp-relay", "no-cli", "no-rfc5780",
             "no-stun-backward-compatibility", "response-origin-only-with-rfc5780",
             "no-multicast-peers"]
    if cfg.peers:
        lines.append("denied-peer-ip=0.0.0.0-255.255.255.255")
        lines += [f"allowed-peer-ip={peer}" for peer in cfg.peers]
        if any(_loopback(peer) for peer in cfg.peers):
            lines.append("allow-loopback-peers")
    lines += ["log-file=stdout", "simple-log", "new-log-timestamp",
              f"pidfile={cfg.workdir / (cfg.name + '.pid')}",
              f"userdb={cfg.workdir / (cfg.name + '.db')}"]
    if cfg.verbose:
        lines.append("verbose")
    return "\n".join(lines) + "\n"


def write_config(cfg: TurnServerConfig) -> Path:
    """``workdir/<name>.conf``, created 0600 (it holds the secret); returns its path."""
    path = cfg.workdir / f"{cfg.name}.conf"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(config_text(cfg))
    return path


def turnserver_cmd(config: Path) -> list[str]:
    """The command line that runs coturn with ``config`` and nothing else."""
    binary = shutil.which("turnserver")
    if binary is None:
        raise FileNotFoundError("turnserver is not installed (Debian's coturn; make installs it)")
    return [binary, "-c", str(config)]


def answers_binding(host: str, port: int = DEFAULT_PORT, timeout: float = 0.5) -> bool:
    """Whether a STUN server answers a Binding request on ``host:port`` (UDP) in time: how
    the edge knows coturn is ready."""
    txid = os.urandom(12)
    request = struct.pack("!HHI", _BINDING_REQUEST, 0, MAGIC_COOKIE) + txid
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(request, (host, port))
        try:
            data, _ = s.recvfrom(2048)
        except (TimeoutError, ConnectionRefusedError):
            return False
    return (len(data) >= 20 and struct.unpack("!H", data[:2])[0] == _BINDING_SUCCESS
            and data[8:20] == txid)
