"""The front's HTTP API against its contract, docs/openapi.yaml: a real front with API keys and
TURN, in front of a real transceiver, on loopback. Every documented operation answers a
well-formed request as documented (status, headers, content type, body schema); then
schemathesis generates requests from the contract, valid and not, and every answer is a
documented one: no 5xx, no traceback, no call placed, no token minted and no TURN credential
issued without a valid credential."""
from __future__ import annotations

import asyncio
import threading

import hypothesis
import pytest
import requests
import schemathesis
from schemathesis import checks, openapi

from services.client.credential import bearer
from services.signaling.auth import ApiKey, KeyRing
from services.signaling.iceservers import TurnHandout
from services.signaling.server import ClusterRoute, SignalingConfig, SignalingServer
from services.transceiver import ice
from services.transceiver.server import TransceiverConfig, TransceiverServer
from tests.conftest import REPO, until
from tests.offers import STATIC_OFFER

SPEC = REPO / "docs" / "openapi.yaml"
CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
          checks.content_type_conformance, checks.response_headers_conformance,
          checks.response_schema_conformance]
KEY = ApiKey.new("app-a")
FUZZ_EXAMPLES = 40   # per operation and kind of data (valid, invalid)


# SDP and its fragments are text
for _media in ("application/sdp", "application/trickle-ice-sdpfrag"):
    schemathesis.serializer.alias(_media, "text/plain")


class LiveFront:
    """A transceiver and a front with API keys on an event loop of their own thread (the
    checks' HTTP client is synchronous)."""

    def __init__(self, tmp_path) -> None:
        self.keys = tmp_path / "keys"
        self.keys.write_text(f"{KEY.text}\n")
        self.turn_secret = tmp_path / "turn-secret"
        self.turn_secret.write_text("contract-turn-secret\n")
        self.front: SignalingServer | None = None
        self.transceiver: TransceiverServer | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)
        self._failure: BaseException | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.front.port}"

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            config = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host="127.0.0.1",
                                       control=("127.0.0.1", 0), mode=ice.SHARED)
            async with TransceiverServer(config) as transceiver:
                front_config = SignalingConfig(
                    clusters=(ClusterRoute(
                        "c1", (f"http://127.0.0.1:{transceiver.control_port}",)),),
                    listen=("127.0.0.1", 0), poll_interval=0.2, auth=KeyRing.load(self.keys),
                    turn=TurnHandout(("turn:127.0.0.1:3478",), str(self.turn_secret),
                                     ttl_s=3600))
                async with SignalingServer(front_config) as front:
                    await until(lambda: all(b.healthy for b in front.backends))
                    self.front, self.transceiver = front, transceiver
                    self._ready.set()
                    await self._stop.wait()
        except BaseException as exc:   # noqa: BLE001 - reported by start()
            self._failure = exc
            self._ready.set()

    def __enter__(self) -> "LiveFront":
        self._thread.start()
        self._ready.wait(30)
        if self._failure is not None or self.front is None:
            raise RuntimeError(f"the front did not start: {self._failure!r}")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with LiveFront(tmp_path_factory.mktemp("openapi")) as front:
        yield front


@pytest.fixture(scope="module")
def schema(live):
    schema = openapi.from_path(str(SPEC))
    schema.config.update(base_url=live.base)
    return schema


def _checked(schema, method: str, path: str, **request):
    """One request built from the contract's operation, sent, and its answer checked."""
    case = schema[path][method].Case(**request)
    response = case.call(timeout=10)
    case.validate_response(response, checks=CHECKS)
    assert "Traceback" not in response.text
    return response


def test_every_documented_operation_answers_as_documented(live, schema):
    minted = _checked(schema, "POST", "/v1/client_secrets", headers=bearer(KEY.text),
                      media_type="application/json", body={"expires_in": 120, "max_calls": 2})
    assert minted.status_code == 201
    token = minted.json()["value"]
    assert _checked(schema, "POST", "/v1/client_secrets", headers=bearer(token),
                    media_type="application/json", body={}).status_code == 403
    ice_servers = _checked(schema, "GET", "/v1/ice-servers", headers=bearer(token))
    assert ice_servers.status_code == 200 and ice_servers.json()["iceTransportPolicy"] == "relay"
    assert _checked(schema, "GET", "/v1/ice-servers").status_code == 401
    placed = _checked(schema, "POST", "/v1/calls", media_type="application/sdp",
                      headers={**bearer(token), "Content-Type": "application/sdp"},
                      body=STATIC_OFFER)
    assert placed.status_code == 201, (placed.status_code, placed.text)
    call = placed.headers["location"][0].rsplit("/", 1)[1]
    assert _checked(schema, "POST", "/v1/calls", media_type="application/sdp",
                    headers={"Content-Type": "application/sdp"},
                    body=STATIC_OFFER).status_code == 401
    fragment = "a=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n"
    restart = _checked(schema, "PATCH", "/v1/calls/{call}", path_parameters={"call": call},
                       headers={**bearer(token),
                                "Content-Type": "application/trickle-ice-sdpfrag"},
                       media_type="application/trickle-ice-sdpfrag", body=fragment)
    assert restart.status_code == 409   # no ICE ever reached it: not connected
    other = ApiKey("app-a", bytes(32)).text   # the key's id with a wrong secret
    assert _checked(schema, "DELETE", "/v1/calls/{call}", path_parameters={"call": call},
                    headers=bearer(other)).status_code == 401
    assert _checked(schema, "DELETE", "/v1/calls/{call}", path_parameters={"call": call},
                    headers=bearer(token)).status_code == 204
    assert _checked(schema, "DELETE", "/v1/calls/{call}", path_parameters={"call": call},
                    headers=bearer(token)).status_code == 404
    assert _checked(schema, "GET", "/healthz").json() == {"status": "ok"}
    assert _checked(schema, "GET", "/healthz", headers=bearer(KEY.text)).json()["transceivers"]
    assert _checked(schema, "GET", "/metrics", headers=bearer(KEY.text)).status_code == 200
    assert _checked(schema, "GET", "/metrics", headers=bearer(token)).status_code == 403
    assert _checked(schema, "GET", "/metrics").status_code == 401
    assert _checked(schema, "GET", "/call").status_code == 200


OPERATIONS = [("POST", "/v1/calls"), ("DELETE", "/v1/calls/{call}"),
              ("PATCH", "/v1/calls/{call}"), ("POST", "/v1/client_secrets"),
              ("GET", "/v1/ice-servers"), ("GET", "/healthz"), ("GET", "/metrics"),
              ("GET", "/call")]


def _fuzz(live, operation, credential: str | None) -> dict[int, int]:
    """Generated requests, valid and invalid by the contract, each answer checked against it;
    with ``credential`` every one carries it (else what schemathesis generates). How many of
    each status came back."""
    seen: dict[int, int] = {}
    for kind in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
        @hypothesis.settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
                             suppress_health_check=list(hypothesis.HealthCheck),
                             phases=[hypothesis.Phase.generate, hypothesis.Phase.shrink])
        @hypothesis.given(case=operation.as_strategy(generation_mode=kind))
        def fuzz(case):
            if credential is not None:
                case.headers = {**(case.headers or {}), "Authorization": f"Bearer {credential}"}
            try:
                response = case.call(timeout=10)
            except requests.exceptions.InvalidHeader:
                return   # requests refuses to send it: nothing reached the front
            case.validate_response(response, checks=CHECKS)
            assert "Traceback" not in response.text
            seen[response.status_code] = seen.get(response.status_code, 0) + 1

        try:
            fuzz()
        except hypothesis.errors.Unsatisfiable:
            # an operation with no input of its own (GET /call): nothing to make invalid
            assert kind is schemathesis.GenerationMode.NEGATIVE and not (
                operation.path_parameters or operation.query or operation.body)
    return seen


@pytest.mark.parametrize("method_path", OPERATIONS)
def test_generated_requests_without_a_credential_get_documented_refusals_and_nothing_else(
        live, schema, method_path):
    method, path = method_path
    before = (live.transceiver.sessions_total, live.front.stats.tokens_minted,
              live.front.ice_servers.issued)
    seen = _fuzz(live, schema[path][method], None)
    # no generated credential is valid: nothing placed, minted or issued
    assert (live.transceiver.sessions_total, live.front.stats.tokens_minted,
            live.front.ice_servers.issued) == before, seen
    assert seen and (path in ("/healthz", "/call") or set(seen) == {401}), seen


@pytest.mark.parametrize("method_path", OPERATIONS[:5])
def test_generated_requests_with_a_key_get_only_documented_answers(live, schema, method_path):
    """Past the credential: the offers, fragments, call ids and token requests schemathesis
    makes up reach the front's own checks, and each answer is a documented one."""
    method, path = method_path
    seen = _fuzz(live, schema[path][method], KEY.text)
    assert seen and set(seen) != {401}, seen
