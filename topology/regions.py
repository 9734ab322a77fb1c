"""Regions as data: the regions file (``regions.yaml`` next to this module), its measured
backbone RTTs, and the link profiles every emulated path is built from.

Rules (docs/regions.md has the reasoning):

- A path of round-trip time RTT is emulated as two directions of RTT/2 mean one-way delay each.
- ``impairment(kind, a, b)`` is the direction a -> b (sent in a, received in b) and gets half of
  the RTT measured FROM a TO b; the emulated round trip is thus the mean of the two measured
  directions (a round trip is one loop whichever end starts it).
- The backbone figures are P95 RTTs; a profile whose RTT comes from them emulates a MEAN RTT of
  ``figure x rtt_scale`` (backbone 1.0: the P95 as is; public_internet: the inflation factor).
- ``public_internet`` between a region and itself is the ``intra_region`` profile.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

import yaml

from topology.impairment.model import BernoulliLoss, GilbertElliottLoss, Impairment, LossModel
from voiceedge.errors import ConfigError

ALL = "all"  # built-in group: every region, in file order
BACKBONE, PUBLIC_INTERNET, INTRA_REGION = "backbone", "public_internet", "intra_region"
LOSS_MODELS = ("none", "bernoulli", "gilbert_elliott")
DISTRIBUTIONS = ("normal", "uniform")
PROFILE_KEYS = ("rtt_ms", "rtt_scale", "jitter_ms", "distribution", "reorder", "loss_model",
                "loss_pct", "loss_mean_burst")
REGION_KEYS = ("provider", "provider_region", "location")
TOP_KEYS = ("regions", "groups", "clusters", "ingress", "backbone", "profiles")
BACKBONE_KEYS = ("statistic", "source", "rtt_ms")

# Sanity bounds on profile values: wide enough for any plausible world, narrow enough to catch a
# value given in the wrong unit (seconds for milliseconds).
MAX_RTT_MS = 2000.0
MAX_JITTER_MS = 500.0
MAX_RTT_SCALE = 10.0

REGION_NAME = re.compile(r"[a-z][a-z0-9-]*")
PROFILE_NAME = re.compile(r"[a-z][a-z0-9_]*")


class CatalogError(ConfigError):
    """A regions file or override that cannot describe a world; the message names the entry."""


@dataclass(frozen=True)
class Region:
    """One emulated region. ``name`` is the short name used everywhere (REGION=, reports)."""

    name: str
    provider: str
    provider_region: str  # the provider's name for it, as in the backbone data
    location: str         # rough, a label only
    cluster: bool = False  # hosts a transceiver cluster
    ingress: bool = False  # hosts a relay ingress point (the anycast VIP)


@dataclass(frozen=True)
class LinkProfile:
    """How one direction of a kind of link behaves.

    The path's RTT is either fixed (``rtt_ms``) or, with ``rtt_ms`` None, the measured backbone
    RTT of the two regions times ``rtt_scale``. Loss is per direction: ``loss_pct`` expected, as
    independent losses (bernoulli) or in runs of ``loss_mean_burst`` packets on average
    (gilbert_elliott, with every packet lost in the bad state and none in the good one).
    """

    name: str
    rtt_ms: float | None = None
    rtt_scale: float = 1.0
    jitter_ms: float = 0.0
    distribution: str = "normal"
    reorder: bool = True
    loss_model: str = "none"
    loss_pct: float = 0.0
    loss_mean_burst: float | None = None

    def __post_init__(self) -> None:
        def bad(what: str) -> CatalogError:
            return CatalogError(f"profile {self.name}: {what}")

        if not PROFILE_NAME.fullmatch(self.name):
            raise bad("name must be lower case letters, digits and _")
        if self.rtt_ms is not None:
            if not 0 < self.rtt_ms <= MAX_RTT_MS:
                raise bad(f"rtt_ms must be in (0, {MAX_RTT_MS:g}], not {self.rtt_ms}")
            if self.rtt_scale != 1.0:
                raise bad("rtt_scale applies only to profiles without a fixed rtt_ms")
        if not 0 < self.rtt_scale <= MAX_RTT_SCALE:
            raise bad(f"rtt_scale must be in (0, {MAX_RTT_SCALE:g}], not {self.rtt_scale}")
        if not 0 <= self.jitter_ms <= MAX_JITTER_MS:
            raise bad(f"jitter_ms must be in [0, {MAX_JITTER_MS:g}], not {self.jitter_ms}")
        if self.distribution not in DISTRIBUTIONS:
            raise bad(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, "
                      f"not {self.distribution!r}")
        if self.loss_model not in LOSS_MODELS:
            raise bad(f"loss_model must be one of {', '.join(LOSS_MODELS)}, "
                      f"not {self.loss_model!r}")
        if not 0 <= self.loss_pct < 100:
            raise bad(f"loss_pct must be in [0, 100), not {self.loss_pct}")
        if self.loss_model == "none" and self.loss_pct:
            raise bad("loss_pct needs a loss_model")
        if self.loss_model != "gilbert_elliott":
            if self.loss_mean_burst is not None:
                raise bad("loss_mean_burst applies only to loss_model gilbert_elliott")
            return
        if self.loss_mean_burst is None or not 1 <= self.loss_mean_burst < math.inf:
            raise bad(f"gilbert_elliott needs loss_mean_burst >= 1 (packets), "
                      f"not {self.loss_mean_burst}")
        most = 100 * self.loss_mean_burst / (1 + self.loss_mean_burst)
        if self.loss_pct > most:
            raise bad(f"loss_pct {self.loss_pct} is impossible with mean bursts of "
                      f"{self.loss_mean_burst:g} packets (at most {most:.4g})")

    @property
    def from_backbone(self) -> bool:
        """Whether the RTT comes from the backbone data (else it is the fixed ``rtt_ms``)."""
        return self.rtt_ms is None

    @property
    def loss(self) -> LossModel | None:
        if self.loss_model == "none" or not self.loss_pct:
            return None
        if self.loss_model == "bernoulli":
            return BernoulliLoss(self.loss_pct)
        # Bad state loses everything, good state nothing: mean burst = 100/r, and the share of
        # time in the bad state p/(p+r) is the expected loss.
        r = 100.0 / self.loss_mean_burst
        # at the largest loss a burst allows, p is 100 up to rounding (60% in 1.5-packet bursts
        # computed 100.00000000000001)
        return GilbertElliottLoss(p=min(100.0, r * self.loss_pct / (100.0 - self.loss_pct)), r=r)

    def impairment(self, rtt_ms: float) -> Impairment:
        """One direction of a path whose round trip is ``rtt_ms``: half of it as mean delay."""
        if not 0 < rtt_ms < math.inf:
            raise CatalogError(f"profile {self.name}: RTT must be positive, not {rtt_ms}")
        return Impairment(delay_ms=rtt_ms / 2, jitter_ms=self.jitter_ms,
                          distribution=self.distribution, reorder=self.reorder, loss=self.loss)


@dataclass(frozen=True)
class RegionsCatalog:
    """The regions, their groups, measured backbone RTTs and link profiles; validated whole."""

    regions: tuple[Region, ...]
    groups: Mapping[str, tuple[str, ...]]          # includes ``all``
    backbone: Mapping[tuple[str, str], float]      # measured RTT ms, (source, destination)
    profiles: Mapping[str, LinkProfile]
    backbone_statistic: str = "p95"
    backbone_source: str = ""

    def __post_init__(self) -> None:
        names = [r.name for r in self.regions]
        if not names:
            raise CatalogError("regions: none defined")
        for name in names:
            if not REGION_NAME.fullmatch(name):
                raise CatalogError(f"regions.{name}: name must be lower case letters, digits, -")
        if len(set(names)) != len(names):
            raise CatalogError(f"regions: repeated: {_repeats(names)}")
        self._check_backbone(names)
        self._check_groups(names)
        if not any(r.cluster for r in self.regions):
            raise CatalogError("clusters: no region hosts a transceiver cluster")
        if not any(r.ingress for r in self.regions):
            raise CatalogError("ingress: no region hosts a relay ingress")
        for kind, profile in self.profiles.items():
            if profile.name != kind:
                raise CatalogError(f"profiles.{kind}: holds profile {profile.name!r}")
        for kind in (BACKBONE, PUBLIC_INTERNET, INTRA_REGION):
            if kind not in self.profiles:
                raise CatalogError(f"profiles.{kind}: missing (required)")
        for kind in (BACKBONE, PUBLIC_INTERNET):
            if not self.profiles[kind].from_backbone:
                raise CatalogError(f"profiles.{kind}: takes its RTT from the backbone data "
                                   "(rtt_scale), not a fixed rtt_ms")
        if self.profiles[INTRA_REGION].from_backbone:
            raise CatalogError(f"profiles.{INTRA_REGION}: needs a fixed rtt_ms")

    def _check_backbone(self, names: list[str]) -> None:
        known = set(names)
        for (a, b), rtt in self.backbone.items():
            where = f"backbone.rtt_ms.{a}.{b}"
            if a not in known or b not in known:
                raise CatalogError(f"{where}: unknown region {a if a not in known else b!r}")
            if a == b:
                raise CatalogError(f"{where}: a region has no backbone path to itself")
            if isinstance(rtt, bool) or not isinstance(rtt, (int, float)) \
                    or not 0 < rtt < math.inf:
                raise CatalogError(f"{where}: RTT must be a positive number of ms, not {rtt!r}")
        missing = [f"{a}.{b}" for a in names for b in names
                   if a != b and (a, b) not in self.backbone]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise CatalogError(f"backbone.rtt_ms.{missing[0]}: missing{more}; every ordered "
                               "pair of distinct regions needs its measured RTT")

    def _check_groups(self, names: list[str]) -> None:
        known = set(names)
        if tuple(self.groups.get(ALL, ())) != tuple(names):
            raise CatalogError(f"groups.{ALL}: must be every region, in order")
        for group, members in self.groups.items():
            where = f"groups.{group}"
            if not REGION_NAME.fullmatch(group):
                raise CatalogError(f"{where}: name must be lower case letters, digits, -")
            if not members:
                raise CatalogError(f"{where}: empty")
            for member in members:
                if member not in known:
                    raise CatalogError(f"{where}: unknown region {member!r}; "
                                       f"regions: {', '.join(names)}")
            if len(set(members)) != len(members):
                raise CatalogError(f"{where}: repeated: {_repeats(list(members))}")
            if group in known and tuple(members) != (group,):
                raise CatalogError(f"{where}: shares region {group}'s name, so it must be "
                                   f"exactly [{group}]")

    # -- loading -------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path | None = None) -> "RegionsCatalog":
        """Read and validate a regions file; the one shipped with the package by default."""
        if path is None:
            source = "regions.yaml (shipped)"
            text = resources.files(__package__).joinpath("regions.yaml").read_text()
        else:
            source = str(path)
            try:
                text = Path(path).read_text()
            except FileNotFoundError:
                raise CatalogError(f"regions file {path} does not exist") from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CatalogError(f"{source}: not valid YAML: {exc}") from None
        return cls.from_dict(doc, source)

    @classmethod
    def from_dict(cls, doc: Any, source: str = "regions") -> "RegionsCatalog":
        """Build from a parsed regions file (the layout of ``regions.yaml``)."""
        try:
            return _parse(doc)
        except CatalogError as exc:
            raise CatalogError(f"{source}: {exc}") from None

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any]]) -> "RegionsCatalog":
        """A copy with profile parameters replaced: ``{profile: {parameter: value}}``.

        A value of None removes the parameter (e.g. ``loss_mean_burst`` when switching to
        bernoulli, or ``rtt_ms`` to make a profile take its RTT from the backbone data).
        """
        if not isinstance(overrides, Mapping):
            raise CatalogError("overrides must map profile names to {parameter: value}")
        profiles = dict(self.profiles)
        for kind, params in overrides.items():
            if kind not in profiles:
                raise CatalogError(f"overrides: unknown profile {kind!r}; "
                                   f"profiles: {', '.join(profiles)}")
            if not isinstance(params, Mapping):
                raise CatalogError(f"overrides.{kind}: must map parameter names to values")
            merged = _profile_params(profiles[kind])
            for key, value in params.items():
                if key not in PROFILE_KEYS:
                    raise CatalogError(f"overrides.{kind}.{key}: unknown parameter; "
                                       f"parameters: {', '.join(PROFILE_KEYS)}")
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            profiles[kind] = _parse_profile(kind, merged, f"overrides.{kind}")
        try:
            return replace(self, profiles=MappingProxyType(profiles))
        except CatalogError as exc:
            raise CatalogError(f"overrides: {exc}") from None

    # -- queries -------------------------------------------------------------------------------

    def region(self, name: str | Region) -> Region:
        """The region of that short name (case-insensitive)."""
        key = name.name if isinstance(name, Region) else str(name).strip().lower()
        for region in self.regions:
            if region.name == key:
                return region
        raise CatalogError(f"unknown region {name!r}; regions: {self._names()}")

    @property
    def cluster_regions(self) -> list[Region]:
        return [r for r in self.regions if r.cluster]

    @property
    def ingress_regions(self) -> list[Region]:
        return [r for r in self.regions if r.ingress]

    def resolve(self, spec: str) -> list[Region]:
        """Regions named by a REGION= value: a group, a region, or a comma list of either;
        case-insensitive, in the order given, each region once."""
        names = _expand(spec, self._names_tuple(), self.groups)
        return [self.region(n) for n in names]

    def backbone_rtt_ms(self, a: str | Region, b: str | Region) -> float:
        """The measured backbone RTT from ``a`` to ``b`` (the data as is)."""
        src, dst = self.region(a).name, self.region(b).name
        if src == dst:
            raise CatalogError(f"no backbone path from region {src} to itself")
        return self.backbone[(src, dst)]

    def path_rtt_ms(self, kind: str, a: str | Region, b: str | Region | None = None) -> float:
        """The mean RTT emulated for a path of profile ``kind`` from ``a`` to ``b`` (default
        ``a``: a path within one region, e.g. a last mile)."""
        return self._path(kind, a, b)[1]

    def public_rtt_ms(self, a: str | Region, b: str | Region) -> float:
        """Public-internet RTT: backbone x inflation; within one region the intra-region RTT."""
        return self.path_rtt_ms(PUBLIC_INTERNET, a, b)

    def impairment(self, kind: str, a: str | Region, b: str | Region | None = None
                   ) -> Impairment:
        """The impairment of ONE direction, ``a`` -> ``b``, of a path of profile ``kind``."""
        profile, rtt = self._path(kind, a, b)
        return profile.impairment(rtt)

    def nearest(self, region: str | Region, candidates: Iterable[str | Region]) -> Region:
        """The candidate with the lowest measured backbone RTT from ``region`` (the region
        itself if it is a candidate); ties go to the alphabetically first name."""
        src = self.region(region).name
        names = {self.region(c).name for c in candidates}
        if not names:
            raise CatalogError("nearest() needs at least one candidate region")
        best = min(names, key=lambda c: (0.0 if c == src else self.backbone[(src, c)], c))
        return self.region(best)

    def profile(self, kind: str) -> LinkProfile:
        try:
            return self.profiles[kind]
        except KeyError:
            raise CatalogError(f"unknown link profile {kind!r}; "
                               f"profiles: {', '.join(self.profiles)}") from None

    def _path(self, kind: str, a: str | Region, b: str | Region | None
              ) -> tuple[LinkProfile, float]:
        profile = self.profile(kind)
        src = self.region(a).name
        dst = src if b is None else self.region(b).name
        if not profile.from_backbone:
            return profile, profile.rtt_ms
        if src != dst:
            return profile, self.backbone[(src, dst)] * profile.rtt_scale
        if kind == PUBLIC_INTERNET:
            intra = self.profiles[INTRA_REGION]
            return intra, intra.rtt_ms
        raise CatalogError(f"profile {kind}: no path from region {src} to itself")

    def _names_tuple(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regions)

    def _names(self) -> str:
        return ", ".join(self._names_tuple())


# -- parsing ------------------------------------------------------------------------------------

def _parse(doc: Any) -> RegionsCatalog:
    doc = _mapping(doc, "the file")
    _known_keys(doc, TOP_KEYS, "")
    for key in ("regions", "clusters", "ingress", "backbone", "profiles"):
        if key not in doc:
            raise CatalogError(f"{key}: missing")

    raw_regions = _mapping(doc["regions"], "regions")
    info = {}
    for name, entry in raw_regions.items():
        entry = _mapping(entry, f"regions.{name}")
        _known_keys(entry, REGION_KEYS, f"regions.{name}.")
        for key in REGION_KEYS:
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                raise CatalogError(f"regions.{name}.{key}: needs a text value")
        info[str(name)] = entry
    names = tuple(info)

    groups: dict[str, tuple[str, ...]] = {}
    for group, members in _mapping(doc.get("groups") or {}, "groups").items():
        if str(group) == ALL:
            raise CatalogError(f"groups.{ALL}: built in (every region), do not define it")
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise CatalogError(f"groups.{group}: needs a list of region names")
        groups[str(group)] = tuple(members)
    groups[ALL] = names

    def spec_of(key: str) -> list[str]:
        value = doc[key]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        if not isinstance(value, str):
            raise CatalogError(f"{key}: needs a list of region names or a group name")
        try:
            return _expand(value, names, groups)
        except CatalogError as exc:
            raise CatalogError(f"{key}: {exc}") from None

    clusters, ingress = set(spec_of("clusters")), set(spec_of("ingress"))

    raw_backbone = _mapping(doc["backbone"], "backbone")
    _known_keys(raw_backbone, BACKBONE_KEYS, "backbone.")
    for key in ("statistic", "source"):
        if not isinstance(raw_backbone.get(key), str) or not raw_backbone[key].strip():
            raise CatalogError(f"backbone.{key}: needs a text value")
    backbone: dict[tuple[str, str], float] = {}
    for src, row in _mapping(raw_backbone.get("rtt_ms"), "backbone.rtt_ms").items():
        for dst, rtt in _mapping(row, f"backbone.rtt_ms.{src}").items():
            number = isinstance(rtt, (int, float)) and not isinstance(rtt, bool)
            backbone[(str(src), str(dst))] = float(rtt) if number else rtt

    profiles = {str(kind): _parse_profile(str(kind), _mapping(raw, f"profiles.{kind}"),
                                          f"profiles.{kind}")
                for kind, raw in _mapping(doc["profiles"], "profiles").items()}

    regions = tuple(Region(name=n, provider=info[n]["provider"].strip(),
                           provider_region=info[n]["provider_region"].strip(),
                           location=info[n]["location"].strip(),
                           cluster=n in clusters, ingress=n in ingress) for n in names)
    return RegionsCatalog(regions=regions, groups=MappingProxyType(groups),
                          backbone=MappingProxyType(backbone),
                          profiles=MappingProxyType(profiles),
                          backbone_statistic=raw_backbone["statistic"].strip(),
                          backbone_source=raw_backbone["source"].strip())


def _parse_profile(kind: str, raw: Mapping[str, Any], where: str) -> LinkProfile:
    _known_keys(raw, PROFILE_KEYS, f"{where}.")
    if "rtt_ms" in raw and "rtt_scale" in raw:
        raise CatalogError(f"{where}: give rtt_ms (a fixed RTT) or rtt_scale (x the measured "
                           "backbone RTT), not both (an override removes one with None)")
    if "rtt_ms" not in raw and "rtt_scale" not in raw:
        raise CatalogError(f"{where}: needs rtt_ms (a fixed RTT) or rtt_scale (x the measured "
                           "backbone RTT)")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("distribution", "loss_model"):
            if not isinstance(value, str):
                raise CatalogError(f"{where}.{key}: needs a text value, not {value!r}")
        elif key == "reorder":
            if not isinstance(value, bool):
                raise CatalogError(f"{where}.{key}: needs true or false, not {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CatalogError(f"{where}.{key}: needs a number, not {value!r}")
        else:
            value = float(value)
        values[key] = value
    return LinkProfile(name=kind, **values)


def _profile_params(profile: LinkProfile) -> dict[str, Any]:
    """The parameters a regions file would give for ``profile``."""
    params: dict[str, Any] = {"rtt_scale": profile.rtt_scale} if profile.from_backbone \
        else {"rtt_ms": profile.rtt_ms}
    params.update(jitter_ms=profile.jitter_ms, distribution=profile.distribution,
                  reorder=profile.reorder, loss_model=profile.loss_model,
                  loss_pct=profile.loss_pct)
    if profile.loss_mean_burst is not None:
        params["loss_mean_burst"] = profile.loss_mean_burst
    return params


def _expand(spec: str, names: tuple[str, ...], groups: Mapping[str, tuple[str, ...]]
            ) -> list[str]:
    valid = f"groups: {', '.join(groups)}; regions: {', '.join(names)}"
    if not isinstance(spec, str) or not spec.strip():
        raise CatalogError(f"a region spec names regions or groups, not {spec!r}; {valid}")
    out: list[str] = []
    for item in spec.split(","):
        key = item.strip().lower()
        if key in groups:
            members = groups[key]
        elif key in names:
            members = (key,)
        else:
            raise CatalogError(f"unknown region or group {item.strip()!r} in {spec!r}; {valid}")
        out.extend(m for m in members if m not in out)
    return out


def _mapping(value: Any, where: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise CatalogError(f"{where}: needs a mapping, not {type(value).__name__}")
    return value


def _known_keys(mapping: Mapping, allowed: tuple[str, ...], prefix: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise CatalogError(f"{prefix}{key}: unknown key; expected: {', '.join(allowed)}")


def _repeats(items: list[str]) -> str:
    return ", ".join(sorted({i for i in items if items.count(i) > 1}))
