"""The ICE restart's fragment (services/wire/sdpfrag.py): what it writes it reads back, and
anything else is refused with one reason, never another exception."""
from __future__ import annotations

import pytest
from aioice import Candidate
from hypothesis import given, settings, strategies as st

from services.wire.sdpfrag import MAX_BYTES, MAX_CANDIDATES, IceFragment, SdpFragError

HOST = Candidate.from_sdp("1 1 udp 2130706431 10.1.1.2 40000 typ host")
PWD = "p" * 22


def test_a_fragment_reads_back_what_was_written():
    fragment = IceFragment("abcd", PWD, (HOST,), mid="0")
    text = fragment.to_text()
    assert text.startswith("a=ice-ufrag:abcd\r\na=ice-pwd:" + PWD + "\r\n")
    assert text.endswith("a=end-of-candidates\r\n")
    back = IceFragment.parse(text.encode())
    assert (back.ufrag, back.pwd, back.mid) == ("abcd", PWD, "0")
    assert [c.to_sdp() for c in back.candidates] == [HOST.to_sdp()]


@pytest.mark.parametrize("body, reason", [
    ("a=ice-ufrag:abcd\r\n", "needs a=ice-ufrag and a=ice-pwd"),
    ("a=ice-ufrag:ab\r\na=ice-pwd:" + PWD, "bad a=ice-ufrag"),
    ("a=ice-ufrag:abcd\r\na=ice-pwd:short", "bad a=ice-pwd"),
    ("a=ice-ufrag:abcd\r\na=ice-ufrag:efgh\r\na=ice-pwd:" + PWD, "given twice"),
    ("a=ice-ufrag:abcd\r\na=ice-pwd:" + PWD + "\r\na=candidate:1 1 udp", "bad a=candidate"),
    ("a=ice-ufrag:abcd\r\na=ice-pwd:" + PWD + "\r\na=candidate:1 1 tcp 1 1.2.3.4 9 typ host",
     "UDP, component 1"),
    ("a=ice-ufrag:abcd\r\na=ice-pwd:" + PWD + "\r\na=candidate:1 1 udp 1 1.2.3.4 0 typ host",
     "UDP, component 1"),
    ("a=ice-ufrag:abcd\r\na=ice-pwd:" + PWD + "\r\n"
     + "a=candidate:1 1 udp 1 1.2.3.4 9 typ host\r\n" * (MAX_CANDIDATES + 1), "more than"),
    ("a=ice-ufrag:abcd\r\na=ice-pwd:" + PWD + "\r\na=candidate:1 1 udp 1 x.local 9 typ host",
     "IP address"),
    ("x" * (MAX_BYTES + 1), "over"),
    (b"a=ice-ufrag:ab\xffcd", "not ASCII"),
])
def test_what_is_not_a_restart_fragment_is_refused_with_its_reason(body, reason):
    with pytest.raises(SdpFragError, match=reason):
        IceFragment.parse(body.encode() if isinstance(body, str) else body)


_LINES = st.sampled_from(["a=ice-ufrag:", "a=ice-pwd:", "a=candidate:", "a=mid:", "m=audio ",
                          "a=end-of-candidates", ""])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_LINES, st.text(max_size=60)), max_size=20), st.binary(max_size=64))
def test_any_input_is_a_fragment_or_one_refusal(lines, tail):
    body = "\r\n".join(prefix + text for prefix, text in lines).encode("utf-8", "replace") + tail
    try:
        IceFragment.parse(body)
    except SdpFragError as exc:
        assert str(exc) and "\n" not in str(exc)
