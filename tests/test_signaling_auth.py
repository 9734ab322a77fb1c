"""A front with API keys (services/signaling/auth.py, docs/auth.md): a real front and a real
transceiver on loopback. Without a credential nothing reaches the transceiver; a token is
minted by a key only, places at most its calls, and a call ends only by the credential that
created it (or its key); TURN credentials name the caller and expire with its token; no
credential is ever logged."""
from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
import pytest

from services.client.credential import bearer
from services.signaling.auth import ApiKey, KeyRing
from services.signaling.iceservers import TurnHandout
from services.signaling.server import ClusterRoute, SignalingConfig, SignalingServer
from services.transceiver import ice
from services.transceiver.server import TransceiverConfig, TransceiverServer
from tests.conftest import until
from tests.offers import STATIC_OFFER

A, B = ApiKey.new("app-a"), ApiKey.new("app-b")


class Front:
    """The front's base URL and a client session, with the calls' helpers."""

    def __init__(self, http, base, transceiver) -> None:
        self.http, self.base, self.transceiver = http, base, transceiver

    async def call(self, credential, offer) -> tuple[int, str | None, str]:
        async with self.http.post(f"{self.base}/v1/calls", data=offer,
                                  headers={"Content-Type": "application/sdp",
                                           **bearer(credential)}) as r:
            return r.status, r.headers.get("Location"), await r.text()

    async def end(self, credential, location) -> tuple[int, str]:
        async with self.http.delete(f"{self.base}{location}", headers=bearer(credential)) as r:
            return r.status, await r.text()

    async def token(self, credential, **ask) -> tuple[int, dict | str]:
        async with self.http.post(f"{self.base}/v1/client_secrets", json=ask,
                                  headers=bearer(credential)) as r:
            return r.status, (await r.json() if r.status == 201 else await r.text())

    async def ice_servers(self, credential) -> tuple[int, dict | str]:
        async with self.http.get(f"{self.base}/v1/ice-servers",
                                 headers=bearer(credential)) as r:
            return r.status, (await r.json() if r.status == 200 else await r.text())


@contextlib.asynccontextmanager
async def _edge(keys, fronts: int = 1, turn: TurnHandout | None = None):
    """A real transceiver and ``fronts`` fronts with the key file ``keys`` before it, each
    having probed it once: (the transceiver, a Front of each)."""
    config = TransceiverConfig(cluster_id=3, transceiver_id=5, media_host="127.0.0.1",
                               control=("127.0.0.1", 0), mode=ice.SHARED)
    async with TransceiverServer(config) as server, contextlib.AsyncExitStack() as stack:
        front_config = SignalingConfig(
            clusters=(ClusterRoute("c1", (f"http://127.0.0.1:{server.control_port}",)),),
            listen=("127.0.0.1", 0), poll_interval=0.1, auth=KeyRing.load(keys), turn=turn)
        running = [await stack.enter_async_context(SignalingServer(front_config))
                   for _ in range(fronts)]
        http = await stack.enter_async_context(aiohttp.ClientSession())
        await until(lambda: all(b.healthy for f in running for b in f.backends))   # probed
        yield server, [Front(http, f"http://127.0.0.1:{f.port}", server) for f in running]


def _run(tmp_path, body):
    keys = tmp_path / "keys"
    keys.write_text(f"{A.text}\n{B.text} calls_per_minute=2\n")
    secret = tmp_path / "turn-secret"
    secret.write_text("s3cret-for-turn\n")

    async def main():
        turn = TurnHandout(("turn:127.0.0.1:3478",), str(secret), ttl_s=3600)
        async with _edge(keys, turn=turn) as (_, [front]):
            return await body(front, STATIC_OFFER)
    return asyncio.run(main())


def test_without_a_credential_nothing_reaches_a_transceiver(tmp_path, caplog):
    caplog.set_level(logging.INFO)

    async def body(front, offer):
        out = {"none": await front.call(None, offer),
               "forged": await front.call(ApiKey("app-a", bytes(32)).text, offer),
               "ice": await front.ice_servers(None),
               "mint": await front.token(None)}
        out["sessions"] = len(front.transceiver.sessions)
        return out
    out = _run(tmp_path, body)
    assert out["none"][0] == 401 and out["none"][1] is None
    assert out["none"][2].strip().startswith("an Authorization: Bearer credential")
    assert out["forged"][0] == 401 and out["forged"][2] == "unknown credential\n"
    assert out["ice"][0] == 401 and out["mint"][0] == 401
    assert out["sessions"] == 0
    assert A.text not in caplog.text


def test_a_key_places_and_ends_its_calls_and_no_one_else_does(tmp_path):
    async def body(front, offer):
        status, location, _ = await front.call(A.text, offer)
        before = len(front.transceiver.sessions)
        refusals = [await front.end(None, location), await front.end(B.text, location),
                    await front.end(A.text, location.rsplit("~", 1)[0])]   # its tag cut off
        ended = await front.end(A.text, location)
        return status, location, before, refusals, ended, len(front.transceiver.sessions)
    status, location, before, refusals, ended, after = _run(tmp_path, body)
    assert status == 201 and before == 1
    assert location.count("~") == 3 and "~app-a.-." in location   # the key's own call
    assert [code for code, _ in refusals] == [401, 403, 403]
    assert refusals[1][1] == "this credential did not create the call\n"
    assert ended[0] == 204 and after == 0


def test_a_token_is_minted_by_a_key_places_its_calls_and_ends_only_its_own(tmp_path, caplog):
    caplog.set_level(logging.INFO)

    async def body(front, offer):
        status, minted = await front.token(A.text, expires_in=120, max_calls=1)
        token = minted["value"]
        _, other = await front.token(A.text)
        out = {"minted": (status, minted), "by_token": await front.token(token),
               "bad_ttl": await front.token(A.text, expires_in=7200),
               "bad_field": await front.token(A.text, scope="admin")}
        first = await front.call(token, offer)
        out["first"], out["second"] = first, await front.call(token, offer)   # past its 1
        out["other_token"] = await front.end(other["value"], first[1])
        out["own"] = await front.end(token, first[1])
        placed = await front.call(other["value"], offer)
        out["by_key"] = await front.end(A.text, placed[1])   # its key may end it
        out["sessions"] = len(front.transceiver.sessions)
        return out, token
    out, token = _run(tmp_path, body)
    status, minted = out["minted"]
    assert status == 201 and minted["max_calls"] == 1 and minted["value"].startswith("vet_")
    assert out["by_token"][0] == 403 and out["bad_ttl"][0] == 400
    assert out["bad_field"][0] == 400
    assert out["first"][0] == 201 and f"~app-a.{minted['id']}." in out["first"][1]
    assert out["second"][0] == 403 and "1 call(s) are used" in out["second"][2]
    assert out["other_token"][0] == 403
    assert out["own"][0] == 204 and out["by_key"][0] == 204 and out["sessions"] == 0
    assert token not in caplog.text and A.text not in caplog.text
    assert minted["id"] in caplog.text   # the token's id names it in the logs


def test_turn_credentials_name_the_caller_and_end_with_its_token(tmp_path):
    async def body(front, offer):
        _, minted = await front.token(A.text, expires_in=60)
        return minted, await front.ice_servers(minted["value"]), await front.ice_servers(A.text)
    minted, (status, by_token), (_, by_key) = _run(tmp_path, body)
    assert status == 200
    [server] = by_token["iceServers"]
    expiry, user = server["username"].split(":", 1)
    assert user.endswith(f"app-a.{minted['id']}") and int(expiry) <= minted["expires_at"]
    assert by_token["ttl"] <= 60 < by_key["ttl"] == 3600
    assert by_key["iceServers"][0]["username"].endswith(":voiceedge-app-a")


@pytest.mark.parametrize("header", ["Bearer", "Token abc", "Bearer vet_a.b"])
def test_a_malformed_credential_is_one_line_401(tmp_path, header):
    async def body(front, offer):
        async with front.http.post(f"{front.base}/v1/calls", data=offer,
                                   headers={"Content-Type": "application/sdp",
                                            "Authorization": header}) as r:
            return r.status, await r.text()
    status, text = _run(tmp_path, body)
    assert status == 401 and text.count("\n") == 1 and "Traceback" not in text


def test_over_its_quota_a_key_gets_429_with_retry_after_and_the_metrics_count_it(tmp_path):
    async def body(front, offer):
        placed = [await front.call(B.text, offer) for _ in range(2)]
        async with front.http.post(f"{front.base}/v1/calls", data=offer,
                                   headers={"Content-Type": "application/sdp",
                                            "Authorization": f"Bearer {B.text}"}) as r:
            over = r.status, r.headers.get("Retry-After"), await r.text()
        other = await front.call(A.text, offer)   # another key: its own quota (none)
        for _, location, _ in placed + [other]:
            await front.end(None if location is None else B.text if "app-b" in location
                            else A.text, location)
        async with front.http.get(f"{front.base}/metrics", headers=bearer(A.text)) as r:
            metrics = await r.text()
        return placed, over, other, metrics
    placed, over, other, metrics = _run(tmp_path, body)
    assert [p[0] for p in placed] == [201, 201] and other[0] == 201
    status, retry, text = over
    assert status == 429 and 1 <= int(retry) <= 30
    assert text == "key app-b is over its quota of 2 calls a minute\n"
    assert ('voiceedge_signaling_calls_over_quota_total{key="app-b",quota="rate"} 1.0'
            in metrics)
    assert 'voiceedge_signaling_calls_refused_total{status="429"} 1.0' in metrics


def test_a_keys_concurrent_calls_are_counted_across_fronts_by_the_transceivers(tmp_path):
    """Two fronts, one transceiver: a key with two concurrent calls places one at each, and
    its third is refused at either (429); once one ends, the next probe lets it call again.
    Without the transceiver's count each front would see only its own call."""
    first, second, owners, over, third, other, ended, again, metrics = _two_fronts(tmp_path)
    assert first[0] == 201 and second[0] == 201 and owners == {"app-c": 2}
    status, retry, text = over
    assert status == 429 and int(retry) == 1
    assert text == "key app-c has its 2 concurrent calls\n"
    assert third[0] == 429 and other[0] == 201
    assert ended[0] == 204 and again[0] == 201
    assert ('voiceedge_signaling_calls_over_quota_total{key="app-c",quota="concurrent"} 1.0'
            in metrics)


def _two_fronts(tmp_path):
    c = ApiKey.new("app-c")
    keys = tmp_path / "keys"
    keys.write_text(f"{c.text} concurrent_calls=2\n{A.text}\n")

    async def main():
        async with _edge(keys, fronts=2) as (server, fronts):
            http, offer = fronts[0].http, STATIC_OFFER
            first = await fronts[0].call(c.text, offer)
            second = await fronts[1].call(c.text, offer)
            await asyncio.sleep(0.3)   # both fronts probed since
            owners = dict(server.owners)
            async with http.post(f"{fronts[0].base}/v1/calls", data=offer,
                                 headers={"Content-Type": "application/sdp",
                                          **bearer(c.text)}) as r:
                over = r.status, r.headers.get("Retry-After"), await r.text()
            third = await fronts[1].call(c.text, offer)
            other = await fronts[0].call(A.text, offer)   # another key: no quota
            ended = await fronts[1].end(c.text, first[1])
            await asyncio.sleep(0.3)
            again = await fronts[0].call(c.text, offer)
            async with http.get(f"{fronts[0].base}/metrics", headers=bearer(A.text)) as r:
                metrics = await r.text()
            return first, second, owners, over, third, other, ended, again, metrics
    return asyncio.run(main())


def test_the_public_front_shows_no_internal_address_and_its_internals_only_to_a_key(tmp_path):
    async def body(front, offer):
        _, minted = await front.token(A.text)
        token = minted["value"]
        async with front.http.post(f"{front.base}/v1/calls", data=offer,
                                   headers={"Content-Type": "application/sdp",
                                            **bearer(token)}) as r:
            answer = r.status, dict(r.headers), await r.text()
        out = {"answer": answer}
        for who, credential in (("anyone", None), ("token", token), ("key", A.text)):
            async with front.http.get(f"{front.base}/healthz", headers=bearer(credential)) as r:
                out[f"healthz_{who}"] = r.status, await r.json()
            async with front.http.get(f"{front.base}/metrics", headers=bearer(credential)) as r:
                out[f"metrics_{who}"] = r.status, await r.text()
        await front.end(token, answer[1]["Location"])
        out["port"] = front.transceiver.control_port
        return out
    out = _run(tmp_path, body)
    status, headers, sdp = out["answer"]
    address = f"127.0.0.1:{out['port']}"
    assert status == 201 and headers["X-Voiceedge-Transceiver"] == "1"
    assert headers["X-Voiceedge-Cluster"] == "c1"
    assert not any(address in v for v in headers.values()) and address not in sdp
    assert out["healthz_anyone"] == (200, {"status": "ok"})
    assert out["healthz_token"] == (200, {"status": "ok"})
    code, full = out["healthz_key"]
    assert code == 200 and full["transceivers"][0]["url"] == f"http://{address}"
    assert out["metrics_anyone"][0] == 401 and out["metrics_token"][0] == 403
    assert "voiceedge_signaling" not in out["metrics_anyone"][1] + out["metrics_token"][1]
    code, metrics = out["metrics_key"]
    assert code == 200 and "voiceedge_signaling_calls_created_total 1.0" in metrics
