"""An ICE restart of a live aioice Connection, in place (RFC 8445 section 9).

aiortc ties its DTLS transport to the Connection object (``RTCIceTransport`` keeps the
connection's ``recv`` and ``send``) and aioice has no restart, so a new Connection under a live
DTLS transport would leave the DTLS receive loop waiting on the old one. A restart in place
keeps the object, its sockets and its receive queue (so DTLS and SRTP carry on: no new
handshake) and changes what a restart changes: both sides' credentials, the remote candidates
and the check list. The selected pair goes on carrying media until a pair is nominated under
the new credentials (RFC 8445 section 9: the agent keeps sending over the previously selected
pair until then); if the new checks fail, it stays.

Both ends use it: the client (controlling) restarts and awaits the nomination; the
transceiver (controlled) restarts when the client's ``PATCH`` arrives and nominates the pair
the client's USE-CANDIDATE check names. Pinned to aioice 0.13's private state (the check list,
its completion queue, the consent task), like the rest of the project's ICE hooks.
"""
from __future__ import annotations

import asyncio
import secrets
import string
from dataclasses import dataclass

import aioice
from aioice import Candidate
from aioice.ice import ICE_COMPLETED, validate_password, validate_username

RESTART_TIMEOUT_S = 10.0
_ICE_CHARS = string.ascii_letters + string.digits + "+/"


@dataclass(frozen=True)
class IceCredentials:
    ufrag: str
    pwd: str

    @classmethod
    def random(cls, ufrag: str | None = None) -> "IceCredentials":
        """Fresh credentials (a fresh password, and the given ufrag or a fresh one)."""
        def pick(n: int) -> str:
            return "".join(secrets.choice(_ICE_CHARS) for _ in range(n))
        return cls(ufrag or pick(8), pick(24))


def begin(connection: aioice.Connection, local: IceCredentials,
          remote: IceCredentials) -> None:
    """Put the new credentials in force and start a new check list; the selected pair stays
    until a new one is nominated. Checks that arrive from now on are answered with ``local``."""
    validate_username(local.ufrag)
    validate_password(local.pwd)
    if connection._query_consent_task is not None:   # its checks would use the new password
        connection._query_consent_task.cancel()        # before the peer has it
        connection._query_consent_task = None
    for pair in connection._check_list:
        if pair.task is not None:
            pair.task.cancel()
    previous = dict(connection._nominated)
    connection._local_username, connection._local_password = local.ufrag, local.pwd
    connection.remote_username, connection.remote_password = remote.ufrag, remote.pwd
    connection._check_list = []
    connection._check_list_done = False
    connection._check_list_state = asyncio.Queue()
    connection._nominating = set()
    connection._remote_candidates = []
    connection._remote_candidates_end = False
    connection._early_checks.clear()
    connection._early_checks_done = True   # the remote password is known: answer and pair

    def renominated() -> bool:
        """aioice's completion rule, but only for pairs nominated since the restart (the
        selected pair is still in ``_nominated`` until then)."""
        nominated = connection._nominated
        if all(nominated.get(c) not in (None, previous.get(c)) for c in connection._components):
            if not connection._check_list_done:
                connection._check_list_state.put_nowait(ICE_COMPLETED)
                connection._check_list_done = True
            return True
        return False

    connection._check_list_maybe_complete = renominated   # this instance only


async def complete(connection: aioice.Connection, candidates: list[Candidate],
                   timeout: float = RESTART_TIMEOUT_S, final: bool = True) -> None:
    """Pair ``candidates`` (the peer's, from its fragment), check them, and return once a pair
    is nominated under the new credentials; ``ConnectionError`` if none is within
    ``timeout`` (the previous pair then stays). ``final``: the peer's candidates end there
    (the controlling client's view); the controlled transceiver passes False, since the
    client's checks may come from an address it did not list (peer-reflexive, behind a NAT),
    so only the client's nomination or the timeout ends its wait. Consent checks resume
    either way."""
    try:
        for candidate in candidates:
            await connection.add_remote_candidate(candidate)
        if final:
            await connection.add_remote_candidate(None)
        connection._unfreeze_initial()
        deadline = asyncio.get_running_loop().time() + timeout
        while connection._check_periodic():
            await asyncio.sleep(0.02)
        left = deadline - asyncio.get_running_loop().time()
        try:
            result = await asyncio.wait_for(connection._check_list_state.get(), max(0.0, left))
        except asyncio.TimeoutError:
            raise ConnectionError("ICE restart: no pair nominated in time") from None
        if result != ICE_COMPLETED:
            raise ConnectionError("ICE restart: every check failed")
    finally:
        for pair in connection._check_list:
            if pair.task is not None and not pair.nominated:
                pair.task.cancel()
        connection.__dict__.pop("_check_list_maybe_complete", None)
        if not connection._closing and connection._query_consent_task is None:
            connection._query_consent_task = asyncio.create_task(connection.query_consent())
