"""``relay_kill``: SIGKILL of a relay's main process only (a crash, the OOM killer); its
workers must die with it; the relay starts again after ``restart_after_s`` (0.5). With
``redis: false`` the relay's Redis is emptied first, so the restarted relay finds no flow.

Every kill proves the relay died whole: its processes before the kill, those still alive when
it starts again (orphans), the processes holding its port after the restart, and the new
relay's per-worker counters a little later and at the end of the calls."""
from __future__ import annotations

import time
from dataclasses import dataclass

from analysis.faulteffect import GAP_OVER_RESTART
from scenarios.faultkinds.base import FaultKind, Restarting
from services.procfs import alive
from services.relay.lifeline import port_holders
from topology.netns import in_namespace

COUNTERS_AFTER_S = 2.0  # the new relay's per-worker counters this long after ready


@dataclass(frozen=True)
class RelayKillOptions(Restarting):
    redis: bool = True
    default = 0.5

    @classmethod
    def parse(cls, raw, where, kind):
        redis = raw.get("redis", True)
        if not isinstance(redis, bool):
            raise ValueError(f"{where}: redis is true or false")
        return cls(super().parse(raw, where, kind).restart_after_s, redis)


class RelayKill(FaultKind):
    name = "relay_kill"
    targets = ("cluster", "ingress")
    options = RelayKillOptions
    measures = (GAP_OVER_RESTART,)  # what the media gap cost beyond the relay's restart

    def not_applicable(self, spec, plan):
        return None if plan.relayed else f"{plan.architecture} has no relay"

    def prepare(self, spec, record, plan):
        record.redis = spec.options.redis and plan.redis

    def apply(self, run):
        edge, f, r = run.edge, run.spec, run.record
        name = relay_name(f)
        service = edge.services[name]
        p = edge.plan.ports
        before = edge.processes(name)
        r.detail["processes_before"] = before
        r.at_unix = time.time()
        edge.kill(name)
        if not r.redis and edge.plan.redis:
            # "without Redis": the restarted relay finds no flow in its cache
            redis_name = (f"redis-{f.target.region}" if f.target.tier == "cluster"
                          else f"redis-ingress-{f.target.region}")
            in_namespace(edge.services[redis_name].host.netns, _flush_redis, p.redis)
            r.detail["redis_flushed"] = True

        def mend() -> None:
            r.end_unix = time.time()
            orphans = [pid for pid in before if alive(pid)]
            r.detail["orphans_at_restart"] = orphans
            edge.start_service(name)
            r.ready_unix = time.time()
            after = edge.processes(name)
            r.detail["processes_after"] = after
            ports = [(a, p.relay) for a in _relay_addresses(edge, name)]
            holders = in_namespace(service.host.netns, port_holders, ports)
            r.detail["port_holders_after"] = sorted({h.pid for h in holders})
            strangers = sorted({h.pid for h in holders} - set(after))
            r.detail["port_holders_not_new"] = strangers
            if orphans or strangers:
                r.note = (f"ORPHANS: {orphans} of the killed relay were alive at the restart; "
                          f"{strangers} held its port afterwards")

        # then what the new relay's workers carried in their first seconds (a later fault
        # may kill the relay before the end of the calls)
        if run.hold(mend, f.options.restart_after_s or 0.0) and not run.wait(COUNTERS_AFTER_S):
            r.detail["worker_counters_after_restart"] = _worker_counters(edge, name)

    def finish(self, run):
        name = relay_name(run.spec)
        if run.record.ready_unix is not None and run.edge.services[name].process.alive():
            run.record.detail["worker_counters_at_end"] = _worker_counters(run.edge, name)


def relay_name(f) -> str:
    """The edge's service name of the relay a fault targets."""
    t = f.target
    return f"relay-{t.region}" if t.tier == "cluster" else f"ingress-{t.region}"


def _worker_counters(edge, name: str) -> dict:
    """The restarted relay's forwarding counters per worker (what its workers carried since
    the restart; a killed relay's processes count nowhere here)."""
    # imported here: every scenario load imports this module for its options, and the
    # metrics client (prometheus_client) costs more than the rest of the spec
    from services.relay.counters import scrape

    keep = ("packets_to_server", "packets_to_client", "flows_created", "flows_recovered")
    try:
        workers = in_namespace(edge.services[name].host.netns, scrape, edge.metrics_url(),
                               per_worker=True)
    except OSError as exc:
        return {"error": str(exc)}
    return {w: {k: c.get(k, 0) for k in keep} for w, c in workers.items()}


def _relay_addresses(edge, name: str) -> list[str]:
    plan = edge.plan
    if name.startswith("ingress-"):
        return [i.listen for i in plan.ingresses if f"ingress-{i.region}" == name]
    cluster = plan.cluster(name.removeprefix("relay-"))
    return [cluster.internal, cluster.public]


def _flush_redis(port: int) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    try:
        client.flushdb()
    finally:
        client.close()


KIND = RelayKill()
