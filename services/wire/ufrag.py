"""The server ICE ufrag that carries a routing hint.

Layout (15 bytes, base64 without padding = 20 characters of ``[A-Za-z0-9+/]``)::

    byte 0      version (1)
    bytes 1-3   cluster id (12 bits) | transceiver id (12 bits), big endian
    bytes 4-9   48 random bits
    bytes 10-14 tag: HMAC-SHA256(secret, bytes 0-9), first 40 bits

Size budget: 4096 clusters x 4096 transceivers per cluster. Collisions: two sessions of one
transceiver share a ufrag with probability n^2 / 2^49 for n live sessions (n = 10,000:
1.8e-7), and the transceiver rejects a duplicate anyway. A forged or corrupted ufrag passes the
tag with probability 2^-40. 15 bytes is a multiple of 3, so base64 has no padding bits: every
character carries 6 bits of the message and any change to it changes the bytes.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import os
import re
from dataclasses import dataclass

VERSION = 1
MAX_CLUSTER_ID = 0xFFF
MAX_TRANSCEIVER_ID = 0xFFF
UFRAG_LENGTH = 20
_TAG_BYTES = 5
_BODY_BYTES = 10
_ICE_CHARS = re.compile(rb"^[A-Za-z0-9+/]{4,256}$")
# Public (it is in this file): a deployment that signs with it accepts forged routing ufrags.
DEV_SECRET = b"voiceedge-development-secret"
DEV_SECRET_WARNING = ("VOICEEDGE_UFRAG_SECRET is unset (or the development secret): routing "
                      "ufrags are tagged with a secret published in the source, so anyone can "
                      "forge them")


class UfragError(ValueError):
    """A ufrag that is not a valid routing ufrag for this secret."""


@dataclass(frozen=True, slots=True)
class RouteHint:
    cluster_id: int
    transceiver_id: int


class UfragCodec:
    """Makes and checks routing ufrags with one shared secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the ufrag secret must be at least 16 bytes")
        self._secret = secret

    def _tag(self, body: bytes) -> bytes:
        # hmac.digest: OpenSSL's one-shot HMAC, a third of hmac.new's cost (every first
        # packet of a flood of forged ufrags pays it at the relay).
        return hmac.digest(self._secret, body, "sha256")[:_TAG_BYTES]

    def encode(self, cluster_id: int, transceiver_id: int, nonce: bytes | None = None) -> str:
        if not 0 <= cluster_id <= MAX_CLUSTER_ID:
            raise ValueError(f"cluster id {cluster_id} out of range 0..{MAX_CLUSTER_ID}")
        if not 0 <= transceiver_id <= MAX_TRANSCEIVER_ID:
            raise ValueError(f"transceiver id {transceiver_id} out of range 0..{MAX_TRANSCEIVER_ID}")
        nonce = os.urandom(6) if nonce is None else nonce
        if len(nonce) != 6:
            raise ValueError("nonce must be 6 bytes")
        ids = (cluster_id << 12) | transceiver_id
        body = bytes([VERSION]) + ids.to_bytes(3, "big") + nonce
        return base64.b64encode(body + self._tag(body)).decode("ascii")

    def decode(self, ufrag: str | bytes) -> RouteHint:
        """Verify ``ufrag`` and return its hint; raise UfragError otherwise."""
        raw = ufrag.encode("ascii", "replace") if isinstance(ufrag, str) else bytes(ufrag)
        if len(raw) != UFRAG_LENGTH or not _ICE_CHARS.match(raw):
            raise UfragError("not a routing ufrag (length or characters)")
        try:
            blob = base64.b64decode(raw, validate=True)
        except binascii.Error as exc:
            raise UfragError("not base64") from exc
        body, tag = blob[:_BODY_BYTES], blob[_BODY_BYTES:]
        if not hmac.compare_digest(tag, self._tag(body)):
            raise UfragError("tag does not verify")
        if body[0] != VERSION:
            raise UfragError(f"unknown ufrag version {body[0]}")
        ids = int.from_bytes(body[1:4], "big")
        return RouteHint(cluster_id=ids >> 12, transceiver_id=ids & 0xFFF)


def secret_from_env(value: str | None) -> bytes:
    """The shared secret from a config value; the development secret when unset."""
    return value.encode() if value else DEV_SECRET


def is_dev_secret(secret: bytes) -> bool:
    """True when ``secret`` is the public development secret."""
    return hmac.compare_digest(secret, DEV_SECRET)
