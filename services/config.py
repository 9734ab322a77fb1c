"""Configuration helpers shared by the services."""
from __future__ import annotations

from voiceedge.errors import ConfigError


def parse_hostport(text: str, what: str = "address", allow_zero: bool = False) -> tuple[str, int]:
    """'1.2.3.4:5', '[::1]:5' -> (host, port); port 0 ("any") only with ``allow_zero``."""
    text = text.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    low = 0 if allow_zero else 1
    if not sep or not host or not port.isdigit() or not low <= int(port) < 65536:
        raise ConfigError(f"{what} {text!r} is not HOST:PORT")
    return host, int(port)
