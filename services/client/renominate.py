"""A connected client renominates its pair when its media stops (docs/mobility.md).

A NAT that lost or moved the client's mapping sends what the client sends from a new public
port; the transceiver keeps sending to the old one, which reaches no one. Consent checks do
notice (their answers come back through the new mapping), but the silence does. After
``RENOMINATE_AFTER_S`` (0.5 s) without a packet the client sends one check with USE-CANDIDATE
on its selected pair (RFC 8445 7.2.5.2.4 regular nomination, again: what libwebrtc's
renomination does), beside its media watchdog, which still calls again at ``media_timeout_s``
when the path is dead: the check leaves from the new port, the transceiver nominates that
address's pair and its media follows (services/transceiver/ice.py). The session, its DTLS
association and SRTP keys stay.

aiortc has no API for it: the check is aioice's own request on the pair's protocol (aioice
1.x internals, pinned: ``Connection._nominated``, ``Connection.build_request``,
``StunProtocol.request``).
"""
from __future__ import annotations

import logging

from aioice import stun

log = logging.getLogger(__name__)
RETRANSMISSIONS = 2   # the check and two retransmissions (aioice: 0.5 s, then 1 s apart)


def _connection(pc):
    """The aioice Connection under ``pc``'s one (bundled) ICE transport, or None."""
    for transceiver in pc.getTransceivers():
        dtls = transceiver.receiver.transport
        if dtls is not None:
            return dtls.transport._connection
    sctp = pc.sctp
    return sctp.transport.transport._connection if sctp is not None else None


async def renominate(pc) -> bool:
    """Send a check with USE-CANDIDATE on ``pc``'s selected pair; True if it was answered."""
    connection = _connection(pc)
    nominated = getattr(connection, "_nominated", None) if connection is not None else None
    if not nominated:
        return False
    pair = next(iter(nominated.values()))
    request = connection.build_request(pair, nominate=True)
    try:
        await pair.protocol.request(request, pair.remote_addr,
                                    integrity_key=connection.remote_password.encode(),
                                    retransmissions=RETRANSMISSIONS)
    except (stun.TransactionError, ConnectionError, OSError) as exc:
        log.debug("renomination not answered: %s", exc)
        return False
    return True
