"""Property tests for the routing ufrag codec (services/wire/ufrag.py)."""
import re
import string

import pytest
from hypothesis import given, settings, strategies as st

from services.wire.ufrag import (
    MAX_CLUSTER_ID, MAX_TRANSCEIVER_ID, UFRAG_LENGTH, RouteHint, UfragCodec, UfragError,
)

SECRET = b"0123456789abcdef-test-secret"
CODEC = UfragCodec(SECRET)
ICE_ALPHABET = string.ascii_letters + string.digits + "+/"
ICE_UFRAG = re.compile(r"[A-Za-z0-9+/]{4,256}")

cluster_ids = st.integers(0, MAX_CLUSTER_ID)
transceiver_ids = st.integers(0, MAX_TRANSCEIVER_ID)
ice_chars = st.sampled_from(ICE_ALPHABET)


@settings(max_examples=200)
@given(cluster_ids, transceiver_ids)
def test_round_trip(cluster_id, transceiver_id):
    ufrag = CODEC.encode(cluster_id, transceiver_id)
    assert len(ufrag) == UFRAG_LENGTH
    assert ICE_UFRAG.fullmatch(ufrag)
    assert CODEC.decode(ufrag) == RouteHint(cluster_id, transceiver_id)
    assert CODEC.decode(ufrag.encode("ascii")) == RouteHint(cluster_id, transceiver_id)


@pytest.mark.parametrize("cluster_id", [0, 1, MAX_CLUSTER_ID])
@pytest.mark.parametrize("transceiver_id", [0, 1, MAX_TRANSCEIVER_ID])
def test_round_trip_corners(cluster_id, transceiver_id):
    hint = CODEC.decode(CODEC.encode(cluster_id, transceiver_id))
    assert (hint.cluster_id, hint.transceiver_id) == (cluster_id, transceiver_id)


def test_fixed_nonce_is_deterministic_and_limits_are_4095():
    assert MAX_CLUSTER_ID == MAX_TRANSCEIVER_ID == 4095
    a = CODEC.encode(7, 9, nonce=bytes(6))
    assert a == CODEC.encode(7, 9, nonce=bytes(6))
    assert a.startswith("AQBwCQAAAAAA")  # version 1, ids 0x007009, zero nonce
    assert CODEC.decode(a) == RouteHint(7, 9)


def test_two_encodes_differ():
    ufrags = {CODEC.encode(5, 6) for _ in range(50)}
    assert len(ufrags) == 50
    assert all(CODEC.decode(u) == RouteHint(5, 6) for u in ufrags)


@settings(max_examples=300)
@given(cluster_ids, transceiver_ids, st.integers(0, UFRAG_LENGTH - 1), ice_chars)
def test_any_single_character_change_is_rejected(cluster_id, transceiver_id, pos, char):
    ufrag = CODEC.encode(cluster_id, transceiver_id)
    if ufrag[pos] == char:
        char = ICE_ALPHABET[(ICE_ALPHABET.index(char) + 1) % len(ICE_ALPHABET)]
    changed = ufrag[:pos] + char + ufrag[pos + 1:]
    assert changed != ufrag and len(changed) == UFRAG_LENGTH
    with pytest.raises(UfragError):
        CODEC.decode(changed)


@settings(max_examples=100)
@given(cluster_ids, transceiver_ids, st.integers(0, UFRAG_LENGTH), ice_chars)
def test_insertion_and_deletion_are_rejected(cluster_id, transceiver_id, pos, char):
    ufrag = CODEC.encode(cluster_id, transceiver_id)
    with pytest.raises(UfragError):
        CODEC.decode(ufrag[:pos] + char + ufrag[pos:])
    if pos < UFRAG_LENGTH:
        with pytest.raises(UfragError):
            CODEC.decode(ufrag[:pos] + ufrag[pos + 1:])


def test_trailing_newline_and_whitespace_are_rejected():
    ufrag = CODEC.encode(1, 2)
    for bad in (ufrag[:-1] + "\n", ufrag + "\n", " " + ufrag[1:], ufrag[:-1] + "=", ""):
        with pytest.raises(UfragError):
            CODEC.decode(bad)


@settings(max_examples=200)
@given(st.text())
def test_random_text_is_rejected(text):
    with pytest.raises(UfragError):
        CODEC.decode(text)


@settings(max_examples=200)
@given(st.binary(max_size=40))
def test_random_bytes_are_rejected(raw):
    with pytest.raises(UfragError):
        CODEC.decode(raw)


@settings(max_examples=300)
@given(st.text(alphabet=ICE_ALPHABET, min_size=UFRAG_LENGTH, max_size=UFRAG_LENGTH))
def test_random_ice_strings_of_ufrag_length_are_rejected(text):
    with pytest.raises(UfragError):
        CODEC.decode(text)


@settings(max_examples=50)
@given(cluster_ids, transceiver_ids)
def test_other_secret_is_rejected(cluster_id, transceiver_id):
    other = UfragCodec(b"another-secret-of-enough-length")
    with pytest.raises(UfragError):
        CODEC.decode(other.encode(cluster_id, transceiver_id))
    with pytest.raises(UfragError):
        other.decode(CODEC.encode(cluster_id, transceiver_id))


@pytest.mark.parametrize("cluster_id, transceiver_id", [
    (-1, 0), (0, -1), (MAX_CLUSTER_ID + 1, 0), (0, MAX_TRANSCEIVER_ID + 1), (1 << 24, 1 << 24),
])
def test_out_of_range_ids_raise_value_error(cluster_id, transceiver_id):
    with pytest.raises(ValueError, match="out of range"):
        CODEC.encode(cluster_id, transceiver_id)


@pytest.mark.parametrize("nonce", [b"", bytes(5), bytes(7)])
def test_bad_nonce_length_raises_value_error(nonce):
    with pytest.raises(ValueError, match="nonce"):
        CODEC.encode(1, 1, nonce=nonce)


@pytest.mark.parametrize("secret", [b"", b"x", bytes(15)])
def test_short_secret_raises_value_error(secret):
    with pytest.raises(ValueError, match="at least 16 bytes"):
        UfragCodec(secret)
    UfragCodec(bytes(16))  # exactly 16 is accepted
