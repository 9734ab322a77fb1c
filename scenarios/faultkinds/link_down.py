"""``link_down``: both directions of a link lose every packet for ``duration_s``."""
from __future__ import annotations

from dataclasses import dataclass

from scenarios.faultkinds.base import Lasting
from scenarios.faultkinds.link import LinkFault
from topology.impairment.model import link_down


@dataclass(frozen=True)
class LinkDownOptions(Lasting):
    pass


class LinkDown(LinkFault):
    name = "link_down"
    options = LinkDownOptions

    def change(self, options):
        return link_down


KIND = LinkDown()
