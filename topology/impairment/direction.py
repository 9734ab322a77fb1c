"""Per-packet decisions for one impaired direction: lose it, or release it at a given time.

The semantics follow netem's, so both backends mean the same thing by an ``Impairment``:

- loss is decided first; a lost packet takes no delay slot and no link time;
- Gilbert-Elliott: on each packet the state may change (good -> bad with ``p``, bad -> good
  with ``r``), then the packet is lost with the loss probability of the new state;
- delay: normal with sd ``jitter_ms``, or uniform with the same sd (half-width sd * sqrt 3);
  below zero it is clipped to zero;
- ``reorder=False``: a packet is never released before the previous one
  (release = max(arrival + delay, previous release));
- ``rate_mbit``: the packet is serialised after the previous one and then delayed, which also
  keeps order: release = max(arrival + delay, previous release) + length * 8 / rate, exactly
  netem's formula (netem with a rate never reorders).
"""
from __future__ import annotations

import math
import random

from topology.impairment.model import BernoulliLoss, GilbertElliottLoss, Impairment

_SQRT3 = math.sqrt(3.0)


class Direction:
    """The mutable state of one direction (loss state, last release); not thread-safe."""

    def __init__(self, imp: Impairment, rng: random.Random | None = None) -> None:
        self.impairment = imp
        self._rng = rng or random.Random()
        self._delay = imp.delay_ms / 1e3
        self._jitter = imp.jitter_ms / 1e3
        self._uniform = imp.distribution == "uniform"
        self._fifo = not imp.reorder or imp.rate_mbit is not None
        self._sec_per_byte = 8.0 / (imp.rate_mbit * 1e6) if imp.rate_mbit else 0.0
        self._last = 0.0
        self._bad = False
        loss = imp.loss
        self._bernoulli = loss.pct / 100 if isinstance(loss, BernoulliLoss) else None
        self._ge = ((loss.p / 100, loss.r / 100, loss.bad_loss / 100, loss.good_loss / 100)
                    if isinstance(loss, GilbertElliottLoss) else None)

    def changed(self, imp: Impairment) -> "Direction":
        """This direction under a new impairment, from now on: the same random stream, loss
        state and last release (so a FIFO direction stays in order across the change)."""
        new = Direction(imp, self._rng)
        new._last, new._bad = self._last, self._bad
        return new

    def params(self) -> tuple:
        """The model as the native core takes it (topology/impairment/_engine.c: ``add``,
        ``set``): delay and jitter in seconds, uniform, FIFO, seconds per byte, the loss kind
        (0 none, 1 Bernoulli, 2 Gilbert-Elliott) and its probabilities."""
        kind, bernoulli, ge = 0, 0.0, (0.0, 0.0, 0.0, 0.0)
        if self._bernoulli is not None:
            kind, bernoulli = 1, self._bernoulli
        elif self._ge is not None:
            kind, ge = 2, self._ge
        return (self._delay, self._jitter, self._uniform, self._fifo, self._sec_per_byte,
                kind, bernoulli, *ge)

    def random_state(self) -> tuple:
        """The random stream's state (``random.Random.getstate``): where a copy continues."""
        return self._rng.getstate()

    @property
    def needs_length(self) -> bool:
        return self._sec_per_byte > 0

    def lost(self) -> bool:
        rnd = self._rng.random
        if self._bernoulli is not None:
            return rnd() < self._bernoulli
        if self._ge is not None:
            p, r, bad_loss, good_loss = self._ge
            if self._bad:
                if rnd() < r:
                    self._bad = False
            elif rnd() < p:
                self._bad = True
            return rnd() < (bad_loss if self._bad else good_loss)
        return False

    def draw_delay(self) -> float:
        """One delay in seconds."""
        if not self._jitter:
            return self._delay
        if self._uniform:
            d = self._delay + (2 * self._rng.random() - 1) * _SQRT3 * self._jitter
        else:
            d = self._rng.gauss(self._delay, self._jitter)
        return d if d > 0 else 0.0

    def decide(self, now: float, length: int = 0) -> float | None:
        """Release time (same clock as ``now``, seconds) of a packet arriving at ``now`` with
        ``length`` bytes, or None if it is lost."""
        if self.lost():
            return None
        release = now + self.draw_delay()
        if self._fifo:
            if release < self._last:
                release = self._last
            release += length * self._sec_per_byte
            self._last = release
        return release
