"""Prometheus metrics of one AgentServer, read from its counters at scrape time."""
from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from services.agent.server import AgentServer

HELP = {
    "frames_in": "well-formed audio frames received",
    "frames_out": "audio frames sent (echo or reply)",
    "events_in": "text messages received",
    "events_out": "text messages sent, errors included",
    "bad_frames": "binary messages of the wrong size (answered with bad_frame)",
    "bad_events": "text messages that were not valid events (answered with bad_event)",
    "responses_completed": "replies played to the end",
    "responses_cancelled": "replies stopped early (barge-in or session end)",
}


class _Collector:
    def __init__(self, server: "AgentServer") -> None:
        self._server = server

    def collect(self):
        mode = self._server.config.mode
        active = GaugeMetricFamily("voiceedge_agent_sessions_active", "open sessions",
                                   labels=["mode"])
        active.add_metric([mode], len(self._server.sessions))
        yield active
        total = CounterMetricFamily("voiceedge_agent_sessions", "sessions opened", labels=["mode"])
        total.add_metric([mode], self._server.sessions_total)
        yield total
        for name, value in self._server.totals().as_dict().items():
            metric = CounterMetricFamily(f"voiceedge_agent_{name}", HELP[name], labels=["mode"])
            metric.add_metric([mode], value)
            yield metric


def registry_for(server: "AgentServer") -> CollectorRegistry:
    """A registry of its own per server: two agents in one process never share metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(server))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
