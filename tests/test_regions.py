"""Regions catalogue (topology/regions.py and regions.yaml): data, groups, steering, profiles."""
from __future__ import annotations

import copy
import csv
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from topology.impairment.model import BernoulliLoss, GilbertElliottLoss, Impairment
from topology.regions import LinkProfile, RegionsCatalog

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "topology" / "regions.yaml"
# The measured data, as shipped with the project (source in its header).
CSV = REPO / "topology" / "data" / "backbone_p95_rtt_ms.csv"

CATALOG = RegionsCatalog.load()
NAMES = [r.name for r in CATALOG.regions]

# Short names (docs/regions.md) -> the provider's region name in the data.
SHORT_NAMES = {
    "na-east": "East US", "na-west": "West US", "sa": "Brazil South", "eu-west": "West Europe",
    "me": "UAE North", "af": "South Africa North", "in": "Central India",
    "apac-se": "Southeast Asia", "apac-ne": "Japan East", "au": "Australia East",
}


def shipped_doc() -> dict:
    return yaml.safe_load(SHIPPED.read_text())


def write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# -- the data --------------------------------------------------------------------------------

def read_csv() -> tuple[list[dict], str]:
    lines = CSV.read_text().splitlines()
    header = [l.lstrip("#").strip() for l in lines if l.startswith("#")]
    rows = list(csv.DictReader(l for l in lines if not l.startswith("#")))
    return rows, " ".join(header)


def csv_rtt() -> dict[tuple[str, str], float]:
    """The measured RTTs straight from the data file, by short name (SHORT_NAMES)."""
    rows, _ = read_csv()
    by_provider = {provider: name for name, provider in SHORT_NAMES.items()}
    return {(by_provider[r["src"]], by_provider[r["dst"]]): float(r["p95_rtt_ms"]) for r in rows}


CSV_RTT = csv_rtt()


def test_backbone_matches_the_measured_csv_row_by_row():
    assert len(CSV_RTT) == len(CATALOG.backbone) == 10 * 9
    for (a, b), rtt in CSV_RTT.items():
        assert CATALOG.backbone_rtt_ms(a, b) == rtt, (a, b)


def test_backbone_source_is_the_csv_source_verbatim():
    _, header = read_csv()
    source = header.split("Source: ", 1)[1]
    source = source[: source.index("destination.") + len("destination.")]
    assert CATALOG.backbone_source == source
    assert CATALOG.backbone_statistic == "p95"


def test_directions_kept_as_measured():
    assert CATALOG.backbone_rtt_ms("na-east", "na-west") == 74
    assert CATALOG.backbone_rtt_ms("na-west", "na-east") == 72


def test_regions_short_names_and_providers():
    assert {r.name: r.provider_region for r in CATALOG.regions} == SHORT_NAMES
    assert all(r.provider == "Azure" and r.location for r in CATALOG.regions)


def test_shipped_file_is_the_default():
    assert RegionsCatalog.load(SHIPPED) == CATALOG


def test_default_clusters_and_ingress():
    assert [r.name for r in CATALOG.cluster_regions] == ["na-east", "eu-west", "apac-ne"]
    assert [r.name for r in CATALOG.ingress_regions] == NAMES


# -- groups ----------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, expected", [
    ("apac", ["apac-se", "apac-ne", "au"]),
    ("na", ["na-east", "na-west"]),
    ("eu", ["eu-west"]),
    ("latam", ["sa"]),
    ("sa", ["sa"]),
    ("mea", ["me", "af"]),
    ("in", ["in"]),
    ("all", list(SHORT_NAMES)),
    ("apac-se", ["apac-se"]),
    ("APAC, in ,apac-ne", ["apac-se", "apac-ne", "au", "in"]),
    ("na-west,na", ["na-west", "na-east"]),
])
def test_resolve(spec, expected):
    assert [r.name for r in CATALOG.resolve(spec)] == expected


@pytest.mark.parametrize("spec", ["asia", "apac,nowhere", "", " ", "apac,,eu"])
def test_resolve_unknown_names_the_valid_ones(spec):
    with pytest.raises(ValueError) as err:
        CATALOG.resolve(spec)
    message = str(err.value)
    assert "apac" in message and "na-east" in message, message


# -- steering --------------------------------------------------------------------------------

@pytest.mark.parametrize("region, cluster", [
    ("na-east", "na-east"), ("na-west", "na-east"), ("sa", "na-east"),
    ("eu-west", "eu-west"), ("me", "eu-west"), ("af", "eu-west"),
    ("in", "apac-ne"), ("apac-se", "apac-ne"), ("apac-ne", "apac-ne"), ("au", "apac-ne"),
])
def test_nearest_default_cluster(region, cluster):
    assert CATALOG.nearest(region, CATALOG.cluster_regions).name == cluster


def test_nearest_without_candidates_fails():
    with pytest.raises(ValueError):
        CATALOG.nearest("au", [])


def test_nearest_breaks_ties_by_name(tmp_path):
    doc = shipped_doc()
    doc["backbone"]["rtt_ms"]["au"]["na-west"] = doc["backbone"]["rtt_ms"]["au"]["apac-ne"]
    catalog = RegionsCatalog.load(write(tmp_path, doc))
    for order in (["na-west", "apac-ne"], ["apac-ne", "na-west"]):
        assert catalog.nearest("au", order).name == "apac-ne"


@settings(max_examples=300)
@given(st.sampled_from(NAMES), st.lists(st.sampled_from(NAMES), min_size=1), st.randoms())
def test_nearest_is_a_minimal_candidate_whatever_the_order(region, candidates, rnd):
    def rtt(c):
        return 0 if c == region else CSV_RTT[(region, c)]

    best = CATALOG.nearest(region, candidates).name
    assert best in candidates
    assert rtt(best) == min(rtt(c) for c in candidates)
    shuffled = list(candidates)
    rnd.shuffle(shuffled)
    assert CATALOG.nearest(region, shuffled).name == best


# -- paths and profiles ----------------------------------------------------------------------

PAIRS = [(a, b) for a in NAMES for b in NAMES if a != b]


def test_public_internet_is_longer_than_the_backbone_for_every_pair():
    # regions.yaml: public_internet rtt_scale 1.4, on the measured P95 (the CSV)
    for a, b in PAIRS:
        assert CATALOG.public_rtt_ms(a, b) > CATALOG.backbone_rtt_ms(a, b), (a, b)
        assert CATALOG.public_rtt_ms(a, b) == pytest.approx(CSV_RTT[(a, b)] * 1.4)
    assert CATALOG.public_rtt_ms("na-east", "eu-west") == pytest.approx(124.6)  # 89 x 1.4
    assert CATALOG.public_rtt_ms("af", "au") == pytest.approx(487.2)            # 348 x 1.4


def test_public_internet_within_a_region_is_the_intra_region_path():
    # regions.yaml's intra_region: rtt_ms 6, jitter 1.0, normal, reordering, bernoulli 0.05 %
    intra = Impairment(delay_ms=3.0, jitter_ms=1.0, distribution="normal", reorder=True,
                       loss=BernoulliLoss(0.05))
    for name in NAMES:
        assert CATALOG.public_rtt_ms(name, name) == 6
        assert CATALOG.impairment("public_internet", name, name) == intra
    assert min(CATALOG.backbone.values()) == 34  # me -> in, the shortest measured path


def test_no_backbone_path_from_a_region_to_itself():
    with pytest.raises(ValueError, match="itself"):
        CATALOG.impairment("backbone", "au", "au")
    with pytest.raises(ValueError, match="itself"):
        CATALOG.backbone_rtt_ms("au", "au")


# (kind, a, b, a -> b one-way ms, b -> a one-way ms, jitter ms, expected loss %), typed from
# regions.yaml: measured P95 RTTs apac-se -> apac-ne 74, apac-ne -> apac-se 74, af -> apac-se
# 211, apac-se -> af 190, na-east -> sa 119, sa -> na-east 121; backbone x 1.0, jitter 0.5,
# bernoulli 0.01 %; public_internet x 1.4, jitter 2.0, gilbert_elliott 0.75 %.
HALF_RTT = [
    ("backbone", "apac-se", "apac-ne", 37.0, 37.0, 0.5, 0.01),
    ("backbone", "af", "apac-se", 105.5, 95.0, 0.5, 0.01),
    ("backbone", "na-east", "sa", 59.5, 60.5, 0.5, 0.01),
    ("public_internet", "apac-se", "apac-ne", 51.8, 51.8, 2.0, 0.75),
    ("public_internet", "af", "apac-se", 147.7, 133.0, 2.0, 0.75),
    ("public_internet", "na-east", "sa", 83.3, 84.7, 2.0, 0.75),
]


@pytest.mark.parametrize("kind, a, b, forward_ms, back_ms, jitter_ms, loss_pct", HALF_RTT)
def test_one_direction_gets_half_the_rtt_measured_from_its_sender(kind, a, b, forward_ms,
                                                                  back_ms, jitter_ms, loss_pct):
    forward, back = CATALOG.impairment(kind, a, b), CATALOG.impairment(kind, b, a)
    assert forward.delay_ms == pytest.approx(forward_ms)
    assert back.delay_ms == pytest.approx(back_ms)
    assert forward.jitter_ms == back.jitter_ms == jitter_ms
    assert forward.expected_loss_pct == pytest.approx(loss_pct)
    assert (forward.distribution, forward.reorder) == ("normal", True)


def test_default_profiles_loss_models():
    backbone = CATALOG.impairment("backbone", "na-east", "eu-west")
    assert backbone.loss == BernoulliLoss(0.01)
    public = CATALOG.impairment("public_internet", "na-east", "eu-west").loss
    assert isinstance(public, GilbertElliottLoss)
    assert public.expected_pct == pytest.approx(0.75)
    assert public.mean_burst == pytest.approx(3)
    assert 0.5 <= public.expected_pct <= 1


# (kind, one-way ms, jitter ms, expected loss %), typed from regions.yaml (rtt_ms 12, 40, 6)
@pytest.mark.parametrize("kind, delay_ms, jitter_ms, loss_pct", [
    ("last_mile_broadband", 6.0, 1.0, 0.1), ("last_mile_mobile", 20.0, 5.0, 0.5),
    ("intra_region", 3.0, 1.0, 0.05)])
def test_fixed_rtt_profiles_ignore_the_backbone(kind, delay_ms, jitter_ms, loss_pct):
    assert not CATALOG.profiles[kind].from_backbone
    for name in ("au", "sa"):
        imp = CATALOG.impairment(kind, name)
        assert imp.delay_ms == delay_ms
        assert imp.jitter_ms == jitter_ms
        assert imp.expected_loss_pct == pytest.approx(loss_pct)


def test_mobile_last_mile_is_worse_than_broadband():
    broadband, mobile = (CATALOG.profiles[k] for k in ("last_mile_broadband", "last_mile_mobile"))
    assert mobile.rtt_ms > broadband.rtt_ms
    assert mobile.jitter_ms > broadband.jitter_ms
    assert mobile.loss_pct > broadband.loss_pct


def test_unknown_profile_or_region_in_a_query():
    with pytest.raises(ValueError, match="last_mile_mobile"):
        CATALOG.impairment("satellite", "au")
    with pytest.raises(ValueError, match="apac-se"):
        CATALOG.impairment("backbone", "au", "mars")


@settings(max_examples=300)
@given(st.floats(0.01, 60), st.floats(1, 50))
def test_gilbert_elliott_parameters_give_the_asked_loss_and_burst(loss_pct, burst):
    def make():
        return LinkProfile("p", loss_model="gilbert_elliott", loss_pct=loss_pct,
                           loss_mean_burst=burst)

    if loss_pct > 100 * burst / (1 + burst):  # more than the bad state's share can carry
        with pytest.raises(ValueError, match="impossible"):
            make()
        return
    loss = make().loss
    assert 0 < loss.p <= 100 and 0 < loss.r <= 100
    assert loss.expected_pct == pytest.approx(loss_pct)
    assert loss.mean_burst == pytest.approx(burst)


# -- overrides -------------------------------------------------------------------------------

def test_overrides_replace_profile_parameters():
    changed = CATALOG.with_overrides({
        "public_internet": {"rtt_scale": 2, "loss_model": "bernoulli", "loss_pct": 2,
                            "loss_mean_burst": None},
        "last_mile_mobile": {"rtt_ms": 80, "jitter_ms": 10},
    })
    assert changed.public_rtt_ms("na-east", "eu-west") == 2 * 89
    assert changed.impairment("public_internet", "na-east", "eu-west").loss == BernoulliLoss(2.0)
    mobile = changed.impairment("last_mile_mobile", "au")
    assert (mobile.delay_ms, mobile.jitter_ms) == (40, 10)
    # The original is untouched, and what was not overridden is kept.
    assert CATALOG.public_rtt_ms("na-east", "eu-west") == pytest.approx(1.4 * 89)
    assert changed.profiles["backbone"] == CATALOG.profiles["backbone"]
    assert (changed.profiles["last_mile_mobile"].loss_pct
            == CATALOG.profiles["last_mile_mobile"].loss_pct)


@pytest.mark.parametrize("overrides, words", [
    ({"public_internet": {"inflation": 1.5}}, ["public_internet.inflation", "rtt_scale"]),
    ({"satellite": {"rtt_ms": 600}}, ["satellite", "last_mile_broadband"]),
    ({"backbone": {"jitter_ms": -1}}, ["backbone", "jitter_ms"]),
    ({"backbone": {"loss_pct": 100}}, ["backbone", "loss_pct"]),
    ({"backbone": {"rtt_scale": "1.2"}}, ["backbone.rtt_scale", "number"]),
    ({"last_mile_mobile": {"rtt_scale": 2}}, ["last_mile_mobile", "not both"]),
    ({"public_internet": {"loss_model": "bernoulli"}}, ["public_internet", "loss_mean_burst"]),
    ({"backbone": {"rtt_ms": 10, "rtt_scale": None}}, ["backbone", "backbone data"]),
    ({"public_internet": 1.5}, ["public_internet"]),
])
def test_bad_overrides_fail_clearly(overrides, words):
    with pytest.raises(ValueError) as err:
        CATALOG.with_overrides(overrides)
    for word in words:
        assert word in str(err.value), str(err.value)


# -- corrupted catalogues --------------------------------------------------------------------

def corrupt_missing_pair(doc):
    del doc["backbone"]["rtt_ms"]["na-east"]["au"]


def corrupt_unknown_region_in_group(doc):
    doc["groups"]["apac"].append("apac-nw")


def corrupt_negative_rtt(doc):
    doc["backbone"]["rtt_ms"]["sa"]["af"] = -327


def corrupt_zero_rtt(doc):
    doc["backbone"]["rtt_ms"]["in"]["me"] = 0


def corrupt_text_rtt(doc):
    doc["backbone"]["rtt_ms"]["in"]["me"] = "35 ms"


def corrupt_self_pair(doc):
    doc["backbone"]["rtt_ms"]["au"]["au"] = 1


def corrupt_unknown_row(doc):
    doc["backbone"]["rtt_ms"]["mars"] = {"au": 1}


def corrupt_unknown_cluster(doc):
    doc["clusters"] = ["na-east", "eu-central"]


def corrupt_group_all(doc):
    doc["groups"]["all"] = ["au"]


def corrupt_group_named_like_other_region(doc):
    doc["groups"]["sa"] = ["sa", "na-east"]


def corrupt_missing_profile(doc):
    del doc["profiles"]["intra_region"]


def corrupt_profile_range(doc):
    doc["profiles"]["last_mile_mobile"]["loss_pct"] = 150


def corrupt_profile_key(doc):
    doc["profiles"]["backbone"]["jiter_ms"] = 1


def corrupt_region_key(doc):
    del doc["regions"]["me"]["provider_region"]


@pytest.mark.parametrize("corrupt, words", [
    (corrupt_missing_pair, ["backbone.rtt_ms.na-east.au", "missing"]),
    (corrupt_unknown_region_in_group, ["groups.apac", "apac-nw"]),
    (corrupt_negative_rtt, ["backbone.rtt_ms.sa.af", "-327"]),
    (corrupt_zero_rtt, ["backbone.rtt_ms.in.me", "positive"]),
    (corrupt_text_rtt, ["backbone.rtt_ms.in.me", "35 ms"]),
    (corrupt_self_pair, ["backbone.rtt_ms.au.au"]),
    (corrupt_unknown_row, ["backbone.rtt_ms.mars.au", "mars"]),
    (corrupt_unknown_cluster, ["clusters", "eu-central"]),
    (corrupt_group_all, ["groups.all"]),
    (corrupt_group_named_like_other_region, ["groups.sa"]),
    (corrupt_missing_profile, ["profiles.intra_region", "missing"]),
    (corrupt_profile_range, ["last_mile_mobile", "loss_pct", "150"]),
    (corrupt_profile_key, ["profiles.backbone.jiter_ms", "unknown"]),
    (corrupt_region_key, ["regions.me.provider_region"]),
])
def test_corrupted_catalogue_names_the_entry(tmp_path, corrupt, words):
    doc = copy.deepcopy(shipped_doc())
    corrupt(doc)
    path = write(tmp_path, doc)
    with pytest.raises(ValueError) as err:
        RegionsCatalog.load(path)
    message = str(err.value)
    assert str(path) in message
    for word in words:
        assert word in message, message


def test_uncorrupted_copy_loads(tmp_path):
    """The corruption tests fail for the corruption, not for the copying."""
    assert RegionsCatalog.load(write(tmp_path, shipped_doc())) == CATALOG


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        RegionsCatalog.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("regions: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        RegionsCatalog.load(bad)
