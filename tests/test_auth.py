"""API keys, call tokens and call owners (services/signaling/auth.py): what a front accepts
and refuses, without a network."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.signaling.auth import (ApiKey, AuthError, Caller, KeyRing, _b64, _unb64)

A, B = ApiKey.new("app-a"), ApiKey.new("app-b")
RING = KeyRing([A, B])
NOW = 1_800_000_000


def bearer(value: str) -> str:
    return f"Bearer {value}"


def refused(header, status=401, now=NOW) -> str:
    with pytest.raises(AuthError) as err:
        RING.authenticate(header, now=now)
    assert err.value.status == status
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_key_is_its_caller_and_a_wrong_secret_is_not():
    assert RING.authenticate(bearer(A.text), now=NOW) == Caller("app-a")
    forged = ApiKey("app-a", bytes(32)).text        # the right id, another secret
    assert refused(bearer(forged)) == "unknown credential"
    assert refused(bearer(ApiKey.new("app-c").text)) == "unknown credential"
    assert "secret" not in repr(A) and A.text not in repr(A)


def test_a_token_names_its_key_and_itself_until_it_expires():
    token = RING.mint(Caller("app-b"), ttl_s=60, max_calls=3, now=NOW)
    caller = RING.authenticate(bearer(token.value), now=NOW + 59)
    assert caller == Caller("app-b", token.id, NOW + 60, 3) and caller.name == f"app-b.{token.id}"
    assert refused(bearer(token.value), now=NOW + 60) == "the call token has expired"
    # minted by a token: refused, 403
    with pytest.raises(AuthError) as err:
        RING.mint(caller)
    assert err.value.status == 403
    with pytest.raises(ValueError, match="expires_in"):
        RING.mint(Caller("app-b"), ttl_s=7200)


def test_a_token_whose_payload_or_key_changed_is_refused():
    token = RING.mint(Caller("app-a"), ttl_s=600, now=NOW).value
    payload, mac = token[4:].split(".")
    fields = json.loads(_unb64(payload))
    for change in ({"e": fields["e"] + 3600}, {"n": 1000}, {"k": "app-b"}, {"t": "other"}):
        forged = _b64(json.dumps(fields | change, separators=(",", ":")).encode())
        assert refused(bearer(f"vet_{forged}.{mac}")) == "unknown credential"
    # the same token from a ring that holds another key of the same id
    other = KeyRing([ApiKey("app-a", bytes(range(32)))])
    with pytest.raises(AuthError):
        other.authenticate(bearer(token), now=NOW)


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic abc",
                                    "Bearer vet_", "Bearer vet_x.y", "Bearer vek_",
                                    "Bearer " + "x" * 600, "Bearer sk-not-ours"])
def test_without_a_credential_or_with_a_malformed_one_401(header):
    refused(header)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_header_is_a_caller_or_one_401(text):
    try:
        RING.authenticate(text, now=NOW)
    except AuthError as exc:
        assert exc.status == 401 and "\n" not in str(exc)


def test_a_call_belongs_to_its_token_and_its_key():
    token = RING.authenticate(bearer(RING.mint(Caller("app-a"), now=NOW).value), now=NOW)
    other = RING.authenticate(bearer(RING.mint(Caller("app-a"), now=NOW).value), now=NOW)
    base = "na-east~0~AbCdEfGhIjKlMnOp"
    owner = RING.owner_tag(token, base)
    RING.check_owner(token, base, owner)            # the token that placed it
    RING.check_owner(Caller("app-a"), base, owner)  # its key
    for stranger in (other, Caller("app-b")):       # another token of the key; another key
        with pytest.raises(AuthError) as err:
            RING.check_owner(stranger, base, owner)
        assert err.value.status == 403
    with pytest.raises(AuthError):                  # the tag moved to another call
        RING.check_owner(token, "na-east~0~ZZZZZZZZZZZZZZZZ", owner)


def test_a_key_file_is_read_and_its_mistakes_named_by_line(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# the deployment's keys\n{A.text}\n\n{B.text}  # app b\n")
    assert KeyRing.load(path).ids == ("app-a", "app-b")
    path.write_text(f"{A.text}\nvek_app-c_short\n")
    with pytest.raises(ValueError) as err:
        KeyRing.load(path)
    assert "line 2" in str(err.value) and "short" not in str(err.value)
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no key"):
        KeyRing.load(path)
    with pytest.raises(ValueError, match="repeat"):
        KeyRing([A, ApiKey.new("app-a")])


def test_voiceedge_token_makes_a_key_and_mints_a_token_a_front_accepts(tmp_path, capsys):
    from voiceedge.cli import main

    assert main(["token", "--new-key", "by-hand"]) == 0
    key = capsys.readouterr().out.strip()
    path = tmp_path / "keys"
    path.write_text(f"{A.text}\n{key}\n")
    assert main(["token", "--api-keys", str(path), "--key", "by-hand", "--expires-in", "60",
                 "--max-calls", "2", "--json"]) == 0
    minted = json.loads(capsys.readouterr().out)
    caller = KeyRing.load(path).authenticate(bearer(minted["value"]))
    assert caller.key_id == "by-hand" and caller.token_id == minted["id"]
    assert caller.max_calls == 2
    # mistakes: one line, exit 2, nothing minted
    for argv in (["token"], ["token", "--api-keys", str(path), "--key", "nope"],
                 ["token", "--api-keys", str(path), "--expires-in", "5"],
                 ["token", "--new-key", "Bad_Id"]):
        assert main(argv) == 2, argv
        out = capsys.readouterr()
        assert out.out == "" and out.err.count("\n") == 1, (argv, out.err)


def test_a_keys_quota_comes_from_its_line_and_refills_by_the_minute(tmp_path):
    from services.signaling.auth import CallRate

    path = tmp_path / "keys"
    path.write_text(f"{A.text} calls_per_minute=2\n{B.text} concurrent_calls=5\n")
    ring = KeyRing.load(path)
    assert ring.calls_per_minute(Caller("app-a")) == 2
    assert ring.concurrent_calls(Caller("app-a")) is None
    assert ring.calls_per_minute(Caller("app-b")) is None
    assert ring.concurrent_calls(Caller("app-b")) == 5
    for bad in ("calls_per_hour=2", "concurrent_calls=0", "calls_per_minute=2 calls_per_minute=3"):
        path.write_text(f"{A.text} {bad}\n")
        with pytest.raises(ValueError, match="line 1: after the key only calls_per_minute"):
            KeyRing.load(path)
    rate = CallRate()
    assert [rate.take("k", 2, 0.0) for _ in range(2)] == [0.0, 0.0]   # a minute's at once
    assert rate.take("k", 2, 0.0) == pytest.approx(30.0)   # then one every 30 s
    assert rate.take("k", 2, 15.0) == pytest.approx(15.0)  # a refusal takes nothing
    assert rate.take("k", 2, 30.0) == 0.0 and rate.take("other", 2, 30.0) == 0.0


def test_the_fronts_key_file_may_come_from_the_environment(monkeypatch, tmp_path):
    from voiceedge.cli import command_parser

    monkeypatch.delenv("VOICEEDGE_API_KEYS_FILE", raising=False)
    assert command_parser("signaling").parse_args(["signaling"]).api_keys is None
    monkeypatch.setenv("VOICEEDGE_API_KEYS_FILE", str(tmp_path / "keys"))
    assert command_parser("signaling").parse_args(["signaling"]).api_keys == str(
        tmp_path / "keys")
    assert command_parser("signaling").parse_args(
        ["signaling", "--api-keys", "given"]).api_keys == "given"
