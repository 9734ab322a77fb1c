"""What an impaired direction of a link does: the model every backend implements."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class BernoulliLoss:
    """Each packet is lost independently with probability ``pct`` / 100."""

    pct: float

    @property
    def expected_pct(self) -> float:
        return self.pct


@dataclass(frozen=True)
class GilbertElliottLoss:
    """Two-state bursty loss (netem's ``loss gemodel p r 1-h 1-k``), all in percent.

    ``p``: good -> bad transition per packet; ``r``: bad -> good; ``bad_loss`` (1-h): loss in
    the bad state (100 = every packet); ``good_loss`` (1-k): loss in the good state.
    """

    p: float
    r: float
    bad_loss: float = 100.0
    good_loss: float = 0.0

    @property
    def expected_pct(self) -> float:
        bad_share = self.p / (self.p + self.r) if self.p + self.r else 0.0
        return bad_share * self.bad_loss + (1 - bad_share) * self.good_loss

    @property
    def mean_burst(self) -> float:
        """Mean length of a run of losses when ``bad_loss`` is 100 and ``good_loss`` 0."""
        return 100.0 / self.r if self.r else float("inf")


LossModel = BernoulliLoss | GilbertElliottLoss


@dataclass(frozen=True)
class Impairment:
    """One direction of a link, applied where that direction is RECEIVED (ingress).

    ``delay_ms`` is the mean one-way delay; ``jitter_ms`` the standard deviation of the delay
    (``distribution`` "normal" or "uniform", delays below zero clipped to zero). With
    ``reorder`` (netem's default) each packet gets its own delay and may overtake another;
    without it packets keep their order, which raises the mean delay at high packet rates.
    """

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    distribution: str = "normal"
    reorder: bool = True
    loss: LossModel | None = None
    rate_mbit: float | None = None

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0:
            raise ValueError("delay and jitter must not be negative")
        if self.distribution not in ("normal", "uniform"):
            raise ValueError(f"unknown delay distribution {self.distribution!r}")
        if self.rate_mbit is not None and self.rate_mbit <= 0:
            raise ValueError("rate must be positive")

    @property
    def expected_loss_pct(self) -> float:
        return self.loss.expected_pct if self.loss else 0.0

    @property
    def is_null(self) -> bool:
        return (not self.delay_ms and not self.jitter_ms and self.loss is None
                and self.rate_mbit is None)


def link_down(imp: Impairment) -> Impairment:
    """``imp`` with every packet lost (a cut link); delay, jitter and rate stay, so the
    direction is the same one again when it is changed back."""
    return replace(imp, loss=BernoulliLoss(100.0))


def with_extra_loss(imp: Impairment, loss_pct: float) -> Impairment:
    """``imp`` with an independent extra loss of ``loss_pct`` on top of its own (a loss burst):
    a packet gets through when both its own loss model and the extra loss spare it. Bursty
    loss stays bursty: the extra loss is added to both states of a Gilbert-Elliott model."""
    if not 0 < loss_pct <= 100:
        raise ValueError(f"extra loss must be in (0, 100] percent, not {loss_pct}")

    def both(pct: float) -> float:  # 100 * (1 - (1 - pct/100) * (1 - loss_pct/100))
        return pct + loss_pct - pct * loss_pct / 100.0

    loss = imp.loss
    if isinstance(loss, GilbertElliottLoss):
        loss = replace(loss, bad_loss=both(loss.bad_loss), good_loss=both(loss.good_loss))
    else:
        loss = BernoulliLoss(both(loss.pct if loss else 0.0))
    return replace(imp, loss=loss)


@dataclass(frozen=True)
class NetNode:
    """A network namespace a backend can act in: a Mininet host or a named netns."""

    name: str
    ns_path: str  # /proc/<pid>/ns/net (Mininet host) or /var/run/netns/<name>

    def run(self, *cmd: str, check: bool = True) -> str:
        proc = subprocess.run(["nsenter", f"--net={self.ns_path}", *cmd],
                              capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(cmd)}: {proc.stderr.strip()}")
        return proc.stdout


def impairment_to_dict(imp: Impairment) -> dict:
    """A JSON-able form of ``imp`` (how a backend hands it to another process)."""
    loss = None
    if isinstance(imp.loss, BernoulliLoss):
        loss = {"kind": "bernoulli", "pct": imp.loss.pct}
    elif isinstance(imp.loss, GilbertElliottLoss):
        loss = {"kind": "gilbert_elliott", "p": imp.loss.p, "r": imp.loss.r,
                "bad_loss": imp.loss.bad_loss, "good_loss": imp.loss.good_loss}
    return {"delay_ms": imp.delay_ms, "jitter_ms": imp.jitter_ms,
            "distribution": imp.distribution, "reorder": imp.reorder, "loss": loss,
            "rate_mbit": imp.rate_mbit}


def impairment_from_dict(data: dict) -> Impairment:
    """The inverse of ``impairment_to_dict``."""
    fields = dict(data)
    loss = fields.pop("loss", None)
    if loss is not None:
        loss = dict(loss)
        kind = loss.pop("kind")
        if kind == "bernoulli":
            loss = BernoulliLoss(**loss)
        elif kind == "gilbert_elliott":
            loss = GilbertElliottLoss(**loss)
        else:
            raise ValueError(f"unknown loss model {kind!r}")
    return Impairment(loss=loss, **fields)
