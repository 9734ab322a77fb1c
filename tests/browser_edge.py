"""What the browser tests share: Chromium, and the demo's one-cluster edge in the test module's
lab namespace (its ``lab`` fixture: ``lab = lab_fixture(...)``) with the probes they read it by.

Import the fixtures into a test module by name (``from tests.browser_edge import chromium,
edge``): pytest resolves ``edge``'s ``lab`` in the importing module.
"""
from __future__ import annotations

import json
import os
import time
import urllib.request

import pytest

from scenarios.demo_edge import demo_plan
from scenarios.edge import Edge
from services.browser.config import DEFAULT_CHROMIUM
from tests.conftest import needs
from topology.netns import in_namespace


@pytest.fixture(scope="module")
@needs("browser")
def chromium() -> str:
    if not os.access(DEFAULT_CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {DEFAULT_CHROMIUM}: run `make browsers` (make test does)")
    return DEFAULT_CHROMIUM


@pytest.fixture(scope="module")
def edge(lab, tmp_path_factory):
    """The demo's edge through the cluster relay (its public address is the VIP)."""
    plan = demo_plan("shared", lab.name, *lab.addresses)
    with Edge(plan, tmp_path_factory.mktemp("browser-edge")) as running:
        yield running


def signaling_url(edge: Edge) -> str:
    return edge.signaling_url(edge.plan.fronts[0])


def get(lab, url: str):
    """(status, headers, body) of a GET inside the lab namespace."""
    def fetch():
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, dict(r.headers), r.read().decode()
    return in_namespace(lab.name, fetch)


def live_sessions(lab, edge: Edge) -> int:
    status = get(lab, f"{edge.control_url(edge.plan.clusters[0])}/status")[2]
    return json.loads(status)["sessions"]


def calls_created(lab, edge: Edge) -> int:
    origin = signaling_url(edge).removesuffix("/v1/calls")
    return json.loads(get(lab, f"{origin}/healthz")[2])["calls_created"]


def wait_for_sessions(lab, edge: Edge, n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while live_sessions(lab, edge) != n:
        assert time.monotonic() < deadline, f"the transceiver never had {n} sessions"
        time.sleep(0.1)
