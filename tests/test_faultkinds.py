"""The fault kinds as plug-ins (scenarios/faultkinds/): one registry that the spec, the
injector and the docs agree on, and the effect each kind writes into faults.json, which the
analysis reads without naming a kind. No root, no network."""
from __future__ import annotations

import ast
import re
from dataclasses import asdict, replace
from importlib import import_module

import pytest

from analysis.faulteffect import LEGACY, MEASURES, Effect
from scenarios.faultkinds import KINDS, FaultKind
from scenarios.faults import FaultRecord
from scenarios.faultspec import FaultSpec
from tests.conftest import REPO

# One fault of each kind, as a scenario file writes it
EXAMPLES = {
    "relay_kill": {"target": "ingress/apac-se", "redis": False},
    "redis_down": {"target": "cluster/eu-west", "duration_s": 4},
    "transceiver_crash": {"target": "cluster/na-east/2", "restart_after_s": 3},
    "cluster_outage": {"target": "cluster/eu-west"},
    "link_down": {"target": "last_mile/au", "duration_s": 3},
    "loss_burst": {"target": "backbone/apac-ne/na-east", "duration_s": 3, "loss_pct": 30},
    "nat_rebind": {"target": "last_mile/apac-se"},
    "ice_restart": {"target": "last_mile/apac-se"},
    "handover": {"target": "last_mile/apac-ne", "to": "apac-se"},
}


def spec(kind: str) -> FaultSpec:
    return FaultSpec.parse({"at_s": 5, "kind": kind, **EXAMPLES[kind]}, 0)


def test_the_registry_holds_the_nine_kinds_in_the_documented_order():
    assert list(KINDS) == ["relay_kill", "redis_down", "transceiver_crash", "cluster_outage",
                           "link_down", "loss_burst", "nat_rebind", "ice_restart", "handover"]
    assert set(EXAMPLES) == set(KINDS)
    assert all(isinstance(k, FaultKind) and KINDS[name] is k for name, k in KINDS.items())


def test_each_kind_parses_its_own_fields():
    kill, redis, crash, outage, cut, burst, rebind, restart, handover = (spec(k) for k in KINDS)
    assert (kill.options.restart_after_s, kill.options.redis, kill.ends_after_s) == \
        (0.5, False, 0.5)  # the default restart
    assert redis.ends_after_s == 4.0
    assert crash.target.transceiver == 2 and crash.ends_after_s == 3.0
    assert outage.ends_after_s is None  # to the end of the run
    assert cut.ends_after_s == 3.0
    assert (burst.options.loss_pct, burst.ends_after_s) == (30.0, 3.0)
    assert rebind.ends_after_s is None and rebind.target.region == "apac-se"  # nothing to mend
    assert restart.ends_after_s is None and restart.target.tier == "last_mile"
    assert handover.options.to == "apac-se" and handover.ends_after_s is None
    # the world builds the second access link it moves the callers onto
    assert handover.fault_kind.access_links(handover) == (("apac-ne", "apac-se"),)
    assert all(spec(k).fault_kind.access_links(spec(k)) == () for k in KINDS if k != "handover")
    assert FaultSpec.parse({"at_s": 1, "kind": "transceiver_crash",
                            "target": "cluster/x"}, 0).ends_after_s is None  # stays down


@pytest.mark.parametrize("raw, message", [
    ({"kind": "link_down", "target": "cluster/x/2", "duration_s": 1},
     "link_down targets backbone or public or last_mile, not cluster/x/2"),
    ({"kind": "redis_down", "target": "cluster/x/2", "duration_s": 1},
     "only transceiver_crash names a transceiver"),
    ({"kind": "loss_burst", "target": "public/a/b", "loss_pct": 5},
     "loss_burst needs duration_s"),
    ({"kind": "loss_burst", "target": "public/a/b", "duration_s": 1, "loss_pct": 0},
     "loss_pct: 0.1..100 (0)"),
    ({"kind": "relay_kill", "target": "cluster/x", "redis": "no"}, "redis is true or false"),
    ({"kind": "transceiver_crash", "target": "cluster/x", "loss_pct": 3},
     "transceiver_crash takes no loss_pct"),
    ({"kind": "relay_kill", "target": "cluster/x", "colour": "red"}, "unknown field(s) colour"),
    ({"kind": "handover", "target": "last_mile/a"}, "handover needs to: the client region"),
    ({"kind": "handover", "target": "public/a/b", "to": "c"}, "handover targets last_mile"),
])
def test_a_kind_refuses_what_is_not_its_own(raw, message):
    with pytest.raises(ValueError) as err:
        FaultSpec.parse({"at_s": 1, **raw}, 0)
    assert message in str(err.value)


def test_each_kind_writes_its_effect_and_older_folders_read_the_same():
    """What each kind writes into faults.json is what analysis/faulteffect.py's LEGACY gives
    a record of that kind without an effect (a folder of an older run): the two agree, so
    re-analysing an old folder measures it as a new run would."""
    assert set(LEGACY) <= set(KINDS)   # the kinds older than effects (nat_rebind is not)
    for name, kind in KINDS.items():
        if name not in LEGACY:
            continue
        f = spec(name)
        effect = kind.effect(f)
        assert effect.hits == (str(f.target),)
        assert replace(effect, hits=()) == LEGACY[name], name
        assert set(effect.measures) <= set(MEASURES)
        record = {"kind": name, "effect": effect.to_dict()}
        assert Effect.of(record) == effect and Effect.of({"kind": name}) == LEGACY[name]


def test_a_record_carries_its_effect_into_faults_json():
    record = FaultRecord("f1", "cluster_outage", "cluster/eu-west", "global-relay", 5.0,
                         effect=KINDS["cluster_outage"].effect(spec("cluster_outage")).to_dict())
    assert asdict(record)["effect"] == {
        "hits": ["cluster/eu-west"], "measures": ["first_new_session_s", "extra_rtt_ms"],
        "steers": True}


def test_an_effect_names_only_measures_the_analysis_knows():
    with pytest.raises(ValueError, match="unknown fault measure"):
        Effect(measures=("colour_ms",))
    # a newer run's measure that this analysis does not know is left out, not an error
    assert Effect.of({"kind": "x", "effect": {"measures": ["colour_ms", "extra_rtt_ms"]}}) \
        == Effect(measures=("extra_rtt_ms",))


def test_the_effect_module_is_a_leaf_both_sides_may_import():
    tree = ast.parse((REPO / "analysis" / "faulteffect.py").read_text())
    imported = {n.module if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    assert imported <= {"__future__", "dataclasses"}, imported


def test_no_analysis_module_names_a_fault_kind():
    """Every kind is handled from faults.json: apart from the frozen LEGACY table, no analysis
    module spells a kind's name."""
    names = re.compile("|".join(rf"\b{k}\b" for k in KINDS))
    offenders = [p.relative_to(REPO).as_posix() for p in (REPO / "analysis").rglob("*.py")
                 if p.name != "faulteffect.py" and names.search(p.read_text())]
    assert offenders == []


def test_the_docs_list_every_kind_and_how_to_add_one():
    doc = (REPO / "docs" / "faults.md").read_text()
    for name in KINDS:
        assert f"| `{name}` |" in doc, name
    assert "## Adding a fault kind" in doc


def test_every_kind_module_of_the_package_is_registered():
    """A kind's module that defines ``KIND`` but is missing from the registry would be a kind
    no scenario can name: each one is in ``KINDS``."""
    package = REPO / "scenarios" / "faultkinds"
    modules = [p.stem for p in package.glob("*.py")
               if re.search(r"^KIND = ", p.read_text(), re.MULTILINE)]
    assert sorted(modules) == sorted(KINDS)
    for name in modules:
        assert import_module(f"scenarios.faultkinds.{name}").KIND is KINDS[name]


def test_a_handover_goes_to_a_client_region_of_the_run_other_than_its_own():
    fault = FaultSpec.parse({"at_s": 1, "kind": "handover", "target": "last_mile/a",
                             "to": "c"}, 0)
    fault.check_regions(["a", "b", "c"], ["a", "c"])
    with pytest.raises(ValueError, match="handover to c: not a client region of this run"):
        fault.check_regions(["a", "b", "c"], ["a", "b"])
    itself = FaultSpec.parse({"at_s": 1, "kind": "handover", "target": "last_mile/a",
                              "to": "a"}, 0)
    with pytest.raises(ValueError, match="to names the same region"):
        itself.fault_kind.access_links(itself)
