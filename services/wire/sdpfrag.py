"""The ICE part of a session description, as an ICE restart carries it: RFC 8840's
``application/trickle-ice-sdpfrag``, the body of a WHIP ``PATCH`` (RFC 9725 section 4.3)::

    a=ice-ufrag:EsAw
    a=ice-pwd:P2uYro0UCOQ4zxjKXaWCBui1
    m=audio 9 UDP/TLS/RTP/SAVPF 111
    a=mid:0
    a=candidate:1 1 udp 2130706431 10.1.1.2 40000 typ host
    a=end-of-candidates

A fragment comes from the network (a client's ``PATCH``): ``IceFragment.parse`` refuses
anything it does not understand with ``SdpFragError`` (one line, for a 400), bounded in size
and in candidates, and never raises anything else.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from aioice import Candidate

CONTENT_TYPE = "application/trickle-ice-sdpfrag"
MAX_BYTES = 8192
MAX_CANDIDATES = 16
_UFRAG = re.compile(r"[A-Za-z0-9+/]{4,256}")    # RFC 8839 5.4: ice-char, 4-256
_PWD = re.compile(r"[A-Za-z0-9+/]{22,256}")     # 22-256
_MID = re.compile(r"[\x21-\x7e]{1,32}")


class SdpFragError(ValueError):
    """A fragment that is not one this edge takes."""


@dataclass(frozen=True)
class IceFragment:
    """ICE credentials and candidates of one media section (BUNDLE: the session's)."""

    ufrag: str
    pwd: str
    candidates: tuple[Candidate, ...] = ()
    mid: str = "0"

    def to_text(self) -> str:
        lines = [f"a=ice-ufrag:{self.ufrag}", f"a=ice-pwd:{self.pwd}",
                 "m=audio 9 UDP/TLS/RTP/SAVPF 111", f"a=mid:{self.mid}"]
        lines += [f"a=candidate:{c.to_sdp()}" for c in self.candidates]
        lines.append("a=end-of-candidates")
        return "\r\n".join(lines) + "\r\n"

    @classmethod
    def parse(cls, body: bytes | str) -> "IceFragment":
        if isinstance(body, bytes):
            if len(body) > MAX_BYTES:
                raise SdpFragError(f"fragment over {MAX_BYTES} bytes")
            try:
                body = body.decode("ascii")
            except UnicodeDecodeError:
                raise SdpFragError("fragment is not ASCII") from None
        elif len(body) > MAX_BYTES:
            raise SdpFragError(f"fragment over {MAX_BYTES} bytes")
        ufrag = pwd = None
        mid = "0"
        candidates: list[Candidate] = []
        for line in body.splitlines():
            line = line.strip()
            if line.startswith("a=ice-ufrag:"):
                ufrag = _one(ufrag, line[12:], _UFRAG, "ice-ufrag")
            elif line.startswith("a=ice-pwd:"):
                pwd = _one(pwd, line[10:], _PWD, "ice-pwd")
            elif line.startswith("a=mid:"):
                mid = line[6:]
                if not _MID.fullmatch(mid):
                    raise SdpFragError("bad a=mid")
            elif line.startswith("a=candidate:"):
                if len(candidates) == MAX_CANDIDATES:
                    raise SdpFragError(f"more than {MAX_CANDIDATES} candidates")
                candidates.append(_candidate(line[12:]))
        if ufrag is None or pwd is None:
            raise SdpFragError("an ICE restart needs a=ice-ufrag and a=ice-pwd")
        return cls(ufrag, pwd, tuple(candidates), mid)


def _one(seen: str | None, value: str, pattern: re.Pattern, name: str) -> str:
    if seen is not None:
        raise SdpFragError(f"a={name} given twice")
    if not pattern.fullmatch(value):
        raise SdpFragError(f"bad a={name}")
    return value


def _candidate(value: str) -> Candidate:
    try:
        candidate = Candidate.from_sdp(value)
    except (ValueError, IndexError, KeyError):
        raise SdpFragError("bad a=candidate") from None
    if (candidate.transport.lower() != "udp" or not 0 < candidate.port < 65536
            or candidate.component != 1):
        raise SdpFragError("bad a=candidate: UDP, component 1, with a port")
    try:   # an address, not a name to resolve (an mDNS .local name would be looked up)
        ipaddress.ip_address(candidate.host)
    except ValueError:
        raise SdpFragError("bad a=candidate: its address must be an IP address") from None
    return candidate
