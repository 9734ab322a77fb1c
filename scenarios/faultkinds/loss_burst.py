"""``loss_burst``: both directions of a link lose ``loss_pct`` % more for ``duration_s``."""
from __future__ import annotations

from dataclasses import dataclass, replace

from scenarios.faultkinds.base import Lasting, number
from scenarios.faultkinds.link import LinkFault
from topology.impairment.model import with_extra_loss


@dataclass(frozen=True)
class LossBurstOptions(Lasting):
    loss_pct: float = 0.0

    @classmethod
    def parse(cls, raw, where, kind):
        lasting = super().parse(raw, where, kind)
        return replace(lasting, loss_pct=number(raw, "loss_pct", where, 0.1, 100.0,
                                                required=True))


class LossBurst(LinkFault):
    name = "loss_burst"
    options = LossBurstOptions

    def change(self, options):
        return lambda imp: with_extra_loss(imp, options.loss_pct)


KIND = LossBurst()
