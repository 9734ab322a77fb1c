"""The ICE servers a front hands out (``GET /v1/ice-servers``, services/signaling/iceservers.py).

Fetched before each session when the client runs with ``--ice-from-signaling``, over a
connection of its own that is closed afterwards: the offer's POST must open its own, as it does
without TURN (docs/scenarios.md, "Network floor"), or the comparison would favour TURN by a
TCP handshake.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
from yarl import URL

from services.client.config import IceServer

PATH = "/v1/ice-servers"
ALL, RELAY = "all", "relay"


class IceServersError(Exception):
    """The ICE servers could not be fetched; the message is the session's one-line error."""


@dataclass(frozen=True)
class IceSettings:
    servers: tuple[IceServer, ...] = ()
    policy: str = ALL


def ice_servers_url(signaling_url: str) -> str:
    """Same origin as the signaling URL, path /v1/ice-servers."""
    return str(URL(signaling_url).with_path(PATH).with_query(None).with_fragment(None))


def parse(body: object) -> IceSettings:
    """An ``RTCConfiguration``-shaped JSON body -> IceSettings (ValueError when malformed)."""
    if not isinstance(body, dict) or not isinstance(body.get("iceServers"), list):
        raise ValueError("no iceServers list")
    policy = body.get("iceTransportPolicy", ALL)
    if policy not in (ALL, RELAY):
        raise ValueError(f"iceTransportPolicy {policy!r}")
    servers = []
    for entry in body["iceServers"]:
        urls = entry.get("urls") if isinstance(entry, dict) else None
        urls = [urls] if isinstance(urls, str) else urls
        if not urls or not all(isinstance(u, str) for u in urls):
            raise ValueError("an ICE server without urls")
        servers += [IceServer(u, entry.get("username"), entry.get("credential")) for u in urls]
    return IceSettings(tuple(servers), policy)


async def fetch(signaling_url: str, timeout_s: float,
                headers: dict[str, str] | None = None) -> IceSettings:
    """GET the front's ICE servers; IceServersError with a one-line reason otherwise."""
    url = ice_servers_url(signaling_url)
    connector = aiohttp.TCPConnector(force_close=True)  # no connection left for the POST
    try:
        async with aiohttp.ClientSession(connector=connector) as http:
            async with http.get(url, headers=headers or {},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status != 200:
                    raise IceServersError(f"ice servers: HTTP {resp.status} from {url}")
                body = await resp.json(content_type=None)
        return parse(body)
    except asyncio.TimeoutError:
        raise IceServersError(f"ice servers: no answer within {timeout_s:g} s") from None
    except aiohttp.ClientError as exc:
        raise IceServersError(f"ice servers: {type(exc).__name__}: {exc}") from None
    except ValueError as exc:
        raise IceServersError(f"ice servers: unusable answer: {exc}") from None
