"""``redis_down``: SIGKILL of a cluster's redis-server, started again after ``duration_s``
(empty: it keeps nothing on disk)."""
from __future__ import annotations

from scenarios.faultkinds.base import FaultKind, Lasting


class RedisDown(FaultKind):
    name = "redis_down"
    targets = ("cluster",)
    options = Lasting  # duration_s

    def not_applicable(self, spec, plan):
        return None if plan.relayed else f"{plan.architecture} has no relay"

    def apply(self, run):
        run.down_then_up([f"redis-{run.spec.target.region}"], run.spec.options.duration_s)


KIND = RedisDown()
