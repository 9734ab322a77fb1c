"""From the regions catalogue to a world spec: which impairment each link direction gets."""
from __future__ import annotations

import itertools

from topology.regions import RegionsCatalog
from topology.world import WorldSpec

DEFAULT_LAST_MILE = "last_mile_broadband"


def world_spec(catalog: RegionsCatalog, regions: list[str], clusters: list[str] | None = None,
               last_mile: str = DEFAULT_LAST_MILE) -> WorldSpec:
    """A world of ``regions`` whose clusters are ``clusters`` (default: the catalogue's cluster
    regions among them, else the first region)."""
    if clusters is None:
        default = {r.name for r in catalog.cluster_regions}
        clusters = [r for r in regions if r in default] or regions[:1]
    impairments = {}
    for region in regions:
        impairments[("last_mile_up", region, region)] = catalog.impairment(last_mile, region)
        impairments[("last_mile_down", region, region)] = catalog.impairment(last_mile, region)
    for a, b in itertools.permutations(regions, 2):
        impairments[("public", a, b)] = catalog.impairment("public_internet", a, b)
        impairments[("backbone", a, b)] = catalog.impairment("backbone", a, b)
    return WorldSpec(regions=tuple(regions), clusters=tuple(clusters), impairments=impairments)
