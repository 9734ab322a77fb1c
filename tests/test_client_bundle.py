"""A BUNDLE answer's transport in its tag's m-line only (RFC 8843), as Pion writes it: what
``bundled_answer`` makes of it, read back with aiortc's own SDP parser. The calls through such
an answer: tests/test_client_bundle_edge.py."""
from __future__ import annotations

from aiortc import sdp as aiortc_sdp

from services.client.bundle import bundled_answer

CANDIDATE = "a=candidate:2893914538 1 udp 2130706431 10.77.9.1 3478 typ host"

# The shape of a Pion v3.1 answer (ICE-lite edge, one host candidate): fingerprint at the
# session level, credentials in every m-line, the candidate and end-of-candidates only in
# the first bundled m-line.
PION_ANSWER = "\r\n".join([
    "v=0", "o=- 5912482341263950651 1733094000 IN IP4 0.0.0.0", "s=-", "t=0 0",
    "a=fingerprint:sha-256 " + ":".join(["3C"] * 32), "a=ice-lite", "a=group:BUNDLE 0 1",
    "m=audio 9 UDP/TLS/RTP/SAVPF 111", "c=IN IP4 0.0.0.0", "a=setup:active", "a=mid:0",
    "a=ice-ufrag:nVbXqBGdfOiMkHxY", "a=ice-pwd:QtvyCulxWkKDvTNPgFzRwZsAeEQyHjaJ",
    "a=rtcp-mux", "a=rtcp-rsize", "a=rtpmap:111 opus/48000/2",
    "a=fmtp:111 minptime=10;useinbandfec=1", "a=ssrc:3472139032 cname:pion",
    "a=msid:pion audio", "a=sendrecv", CANDIDATE, "a=end-of-candidates",
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel", "c=IN IP4 0.0.0.0",
    "a=setup:active", "a=mid:1", "a=sendrecv", "a=sctp-port:5000",
    "a=ice-ufrag:nVbXqBGdfOiMkHxY", "a=ice-pwd:QtvyCulxWkKDvTNPgFzRwZsAeEQyHjaJ", ""])


def parsed(text: str):
    return aiortc_sdp.SessionDescription.parse(text)


def section(text: str, mid: str) -> list[str]:
    """The lines of the m-line with ``mid``, from its m= line to the next."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("m=")] + [len(lines)]
    for a, b in zip(starts, starts[1:]):
        if f"a=mid:{mid}" in lines[a:b]:
            return lines[a:b]
    raise AssertionError(f"no m-line with mid {mid}")


def test_aiortc_alone_sees_no_candidate_for_the_data_channel_m_line():
    # the premise: aiortc's parser keeps the candidates per m-line, and the last bundled
    # m-line (the data channel, here) has none
    media = parsed(PION_ANSWER).media
    assert [len(m.ice_candidates) for m in media] == [1, 0]
    assert [m.ice_candidates_complete for m in media] == [True, False]


def test_the_tags_candidate_and_end_of_candidates_go_to_the_other_bundled_m_line():
    fixed = bundled_answer(PION_ANSWER)
    media = parsed(fixed).media
    assert [len(m.ice_candidates) for m in media] == [1, 1]
    assert [m.ice_candidates_complete for m in media] == [True, True]
    c = media[1].ice_candidates[0]
    assert (c.ip, c.port, c.protocol, c.type) == ("10.77.9.1", 3478, "udp", "host")
    # nothing else was added: the fingerprint is the session's, the credentials are there
    added = [line for line in section(fixed, "1") if line not in section(PION_ANSWER, "1")]
    assert added == [CANDIDATE, "a=end-of-candidates"]
    assert section(fixed, "0") == section(PION_ANSWER, "0")
    assert fixed.endswith("\r\n") and "\n" not in fixed.replace("\r\n", "")


def test_the_tag_is_the_groups_first_mid_not_the_first_m_line():
    # group "1 0": the data channel's m-line is the tag and carries the transport
    text = PION_ANSWER.replace("a=group:BUNDLE 0 1", "a=group:BUNDLE 1 0")
    lines = text.split("\r\n")
    lines.remove(CANDIDATE)
    lines.remove("a=end-of-candidates")
    lines.insert(len(lines) - 1, CANDIDATE)
    text = "\r\n".join(lines)
    media = parsed(bundled_answer(text)).media
    assert [len(m.ice_candidates) for m in media] == [1, 1]
    assert [m.ice_candidates_complete for m in media] == [False, False]  # the tag said none


def test_credentials_and_dtls_role_only_in_the_tag_are_copied_unless_the_session_has_them():
    lines = [line for line in PION_ANSWER.split("\r\n")]
    second = lines.index("m=application 9 UDP/DTLS/SCTP webrtc-datachannel")
    head, tail = lines[:second], lines[second:]
    tail = [line for line in tail
            if not line.startswith(("a=ice-ufrag:", "a=ice-pwd:", "a=setup:"))]
    media = parsed(bundled_answer("\r\n".join(head + tail))).media
    assert media[1].ice.usernameFragment == "nVbXqBGdfOiMkHxY"
    assert media[1].ice.password == "QtvyCulxWkKDvTNPgFzRwZsAeEQyHjaJ"
    assert media[1].dtls.role == "client"  # a=setup:active
    # the session-level fingerprint stays where it is: not repeated in the m-lines
    assert bundled_answer(PION_ANSWER).count("a=fingerprint:") == 1


def test_answers_that_need_nothing_come_back_unchanged():
    every = PION_ANSWER.replace("a=sctp-port:5000",
                                f"a=sctp-port:5000\r\n{CANDIDATE}\r\na=end-of-candidates")
    assert bundled_answer(every) == every
    unbundled = PION_ANSWER.replace("a=group:BUNDLE 0 1\r\n", "")
    assert bundled_answer(unbundled) == unbundled
    audio_only_group = PION_ANSWER.replace("a=group:BUNDLE 0 1", "a=group:BUNDLE 0")
    assert bundled_answer(audio_only_group) == audio_only_group  # mid 1 is not bundled
    assert bundled_answer("") == ""
    lf = PION_ANSWER.replace("\r\n", "\n")
    assert bundled_answer(lf) == bundled_answer(PION_ANSWER).replace("\r\n", "\n")
