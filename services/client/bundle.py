"""A BUNDLE answer's transport, wherever the standard lets the answerer write it.

RFC 8843 (BUNDLE; RFC 8859 names the attribute categories) lets an answerer write the
transport of a BUNDLE group (``a=candidate``, ``a=end-of-candidates``, the ICE credentials, the
DTLS fingerprint and role) only in the m-line of the group's tag, its first mid: Pion does so
with the candidates. aiortc 1.16 takes a bundled transport's remote candidates from the LAST
m-line mapped to it (``setRemoteDescription``), sees none, never checks a pair, and the call
ends in ``setup timeout``. ``bundled_answer`` gives every other bundled m-line the tagged
m-line's transport attributes that it lacks, before the answer is applied: the transport they
describe is the same one, so nothing is invented. An answer that already repeats them in every
m-line (aiortc's, the project's transceiver's) is returned unchanged.
"""
from __future__ import annotations

# Transport attributes (RFC 8859: TRANSPORT category) that aiortc reads per m-line. ICE
# credentials and DTLS parameters also count when the session level carries them (aiortc
# applies session-level values to every m-line), candidates only per m-line.
CANDIDATE, END_OF_CANDIDATES = "candidate", "end-of-candidates"
SESSION_OR_MEDIA = ("ice-ufrag", "ice-pwd", "ice-options", "fingerprint", "setup")


def _attribute(line: str) -> str | None:
    """The attribute name of an ``a=`` line (``a=candidate:...`` -> ``candidate``)."""
    if not line.startswith("a="):
        return None
    return line[2:].split(":", 1)[0]


def _bundle_mids(session: list[str]) -> list[str]:
    """The mids of the session's first ``a=group:BUNDLE`` line, tag first."""
    for line in session:
        if line.startswith("a=group:"):
            semantics, *mids = line[len("a=group:"):].split()
            if semantics == "BUNDLE":
                return mids
    return []


def _mid(section: list[str]) -> str | None:
    for line in section:
        if line.startswith("a=mid:"):
            return line[len("a=mid:"):].strip()
    return None


def bundled_answer(sdp: str) -> str:
    """``sdp`` with each bundled m-line given the BUNDLE tag's transport attributes it lacks:
    its candidates (and ``a=end-of-candidates``) when it has no candidate of its own, its ICE
    credentials, ICE options and DTLS fingerprint and role when neither it nor the session
    level has them. Line endings are kept; an SDP without a BUNDLE group comes back as it was."""
    newline = "\r\n" if "\r\n" in sdp else "\n"
    lines = sdp.split(newline)
    trailer = [""] if lines and lines[-1] == "" else []
    if trailer:
        lines = lines[:-1]
    starts = [i for i, line in enumerate(lines) if line.startswith("m=")]
    if not starts:
        return sdp
    session = lines[:starts[0]]
    sections = [lines[a:b] for a, b in zip(starts, starts[1:] + [len(lines)])]
    mids = _bundle_mids(session)
    by_mid = {_mid(s): s for s in sections}
    tagged = next((by_mid[m] for m in mids if m in by_mid), None)
    if tagged is None:
        return sdp
    session_attrs = {_attribute(line) for line in session}
    changed = False
    for mid in mids:
        section = by_mid.get(mid)
        if section is None or section is tagged:
            continue
        have = {_attribute(line) for line in section}
        copied = []
        if CANDIDATE not in have:
            copied += [line for line in tagged if _attribute(line) == CANDIDATE]
        if END_OF_CANDIDATES not in have:
            copied += [line for line in tagged if _attribute(line) == END_OF_CANDIDATES]
        for name in SESSION_OR_MEDIA:
            if name not in have and name not in session_attrs:
                copied += [line for line in tagged if _attribute(line) == name]
        if copied:
            section.extend(copied)
            changed = True
    if not changed:
        return sdp
    return newline.join(session + [line for s in sections for line in s] + trailer)
