"""Loss statistics from received RTP sequence numbers (16-bit, wrapping)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SEQ_MOD = 1 << 16


def extend_seq(seq: int, reference: int) -> int:
    """The extended sequence number of 16-bit ``seq`` closest to extended ``reference``."""
    candidate = (reference & ~0xFFFF) | (seq & 0xFFFF)
    if candidate - reference > SEQ_MOD // 2:
        candidate -= SEQ_MOD
    elif reference - candidate > SEQ_MOD // 2:
        candidate += SEQ_MOD
    return candidate


def unwrap(seqs: Iterable[int]) -> list[int]:
    """Extended sequence numbers in arrival order, each unwrapped against the highest so far."""
    out: list[int] = []
    highest: int | None = None
    for seq in seqs:
        ext = seq & 0xFFFF if highest is None else extend_seq(seq, highest)
        out.append(ext)
        highest = ext if highest is None else max(highest, ext)
    return out


@dataclass(frozen=True)
class LossStats:
    """Loss between the first and the highest sequence number received (trailing loss is unseen)."""

    expected: int
    received: int   # distinct sequence numbers
    bursts: tuple[int, ...]  # lengths of runs of missing sequence numbers, in sequence order

    @property
    def lost(self) -> int:
        return self.expected - self.received

    @property
    def loss_pct(self) -> float:
        return 100.0 * self.lost / self.expected if self.expected else 0.0


def loss_stats(seqs: Iterable[int]) -> LossStats:
    """Expected, received and loss-burst lengths from 16-bit sequence numbers in arrival order.

    Duplicates count once; a reordered packet fills its gap. The base is the first packet
    received, as in RFC 3550 (A.1), not the lowest one.
    """
    ext = unwrap(seqs)
    if not ext:
        return LossStats(0, 0, ())
    base = ext[0]
    received = sorted({e for e in ext if e >= base})
    bursts = tuple(b - a - 1 for a, b in zip(received, received[1:]) if b - a > 1)
    return LossStats(expected=received[-1] - base + 1, received=len(received), bursts=bursts)


class SeqTracker:
    """Incremental :func:`loss_stats` for live per-second samples; keeps the raw list too."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self._base: int | None = None
        self._highest = 0
        self._seen: set[int] = set()

    def add(self, seq: int) -> None:
        self.seqs.append(seq)
        if self._base is None:
            self._base = self._highest = seq & 0xFFFF
            self._seen.add(self._base)
            return
        ext = extend_seq(seq, self._highest)
        if ext >= self._base:
            self._seen.add(ext)
            self._highest = max(self._highest, ext)

    @property
    def received(self) -> int:
        return len(self.seqs)

    @property
    def lost(self) -> int:
        if self._base is None:
            return 0
        return self._highest - self._base + 1 - len(self._seen)

    def stats(self) -> LossStats:
        return loss_stats(self.seqs)
