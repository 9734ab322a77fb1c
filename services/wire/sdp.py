"""What the edge accepts as an SDP offer, checked before any state is allocated.

The checks give a one-line reason for every refusal: the signaling front and the transceiver
both answer 4xx with it.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_OFFER_BYTES = 64 * 1024


class OfferError(ValueError):
    """An offer the edge refuses; ``str(exc)`` is the one-line reason and ``status`` the HTTP
    status to answer with."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class OfferSummary:
    media: tuple[str, ...]      # m-line kinds in order, e.g. ("audio", "application")
    bundle: tuple[str, ...]     # mids of the BUNDLE group
    candidates: int             # a=candidate lines


def check_offer(body: bytes | str) -> OfferSummary:
    """Parse just enough of an offer to refuse what the edge cannot serve."""
    if isinstance(body, bytes):
        if len(body) > MAX_OFFER_BYTES:
            raise OfferError(f"offer is larger than {MAX_OFFER_BYTES} bytes", 413)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise OfferError("offer is not UTF-8 text") from None
    else:
        text = body
        if len(text.encode()) > MAX_OFFER_BYTES:
            raise OfferError(f"offer is larger than {MAX_OFFER_BYTES} bytes", 413)
    lines = [line.strip() for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    if not lines or lines[0] != "v=0":
        raise OfferError("not an SDP offer: it must start with v=0")
    if any(len(line) < 2 or line[1] != "=" for line in lines):
        raise OfferError("not an SDP offer: every line must be <type>=<value>")
    media, mids, bundle, candidates = [], [], (), 0
    current_mid = None
    for line in lines:
        if line.startswith("m="):
            if media and current_mid is None:
                raise OfferError(f"m={media[-1]} section has no a=mid")
            parts = line[2:].split()
            if len(parts) < 4:
                raise OfferError(f"malformed media line: {line[:60]}")
            media.append(parts[0])
            current_mid = None
        elif line.startswith("a=mid:") and media:
            current_mid = line[6:]
            mids.append(current_mid)
        elif line.startswith("a=group:BUNDLE"):
            bundle = tuple(line[len("a=group:BUNDLE"):].split())
        elif line.startswith("a=candidate:"):
            candidates += 1
    if media and current_mid is None:
        raise OfferError(f"m={media[-1]} section has no a=mid")
    if "audio" not in media:
        raise OfferError("offer has no audio media section")
    if not bundle or set(mids) - set(bundle):
        raise OfferError("offer must use BUNDLE for all media sections (a=group:BUNDLE)")
    return OfferSummary(media=tuple(media), bundle=bundle, candidates=candidates)
