"""The relay process: starts N pinned workers on one port, serves their counters to Prometheus."""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.logs import log_event
from services.relay.config import RelayConfig
from services.relay.counters import COUNTERS, GAUGES, NAMES, shared_block
from services.relay.lifeline import PortTaken, port_holders
from services.relay.sockets import WorkerSockets
from services.relay.worker import run_worker
from services.wire.ufrag import DEV_SECRET_WARNING, is_dev_secret

log = logging.getLogger("voiceedge.relay")


class _Collector:
    """Reads the workers' shared counter rows at scrape time."""

    def __init__(self, server: "RelayServer") -> None:
        self._server = server

    def collect(self):
        rows = self._server.counter_rows()
        tier = self._server.config.tier
        for k, name in enumerate(NAMES):
            family = GaugeMetricFamily if name in GAUGES else CounterMetricFamily
            metric = family(f"voiceedge_relay_{name}", COUNTERS[name], labels=["tier", "worker"])
            for w, row in enumerate(rows):
                metric.add_metric([tier, str(w)], row[k])
            yield metric
        # Not per worker and not voiceedge_relay_*: the same gauge as the transceiver's.
        dev = GaugeMetricFamily("voiceedge_ufrag_dev_secret", "1 when routing ufrags use the "
                                "public development secret", labels=["service"])
        dev.add_metric(["relay"], int(is_dev_secret(self._server.config.secret)))
        yield dev


class RelayServer:
    """Owns the worker processes; ``run`` blocks until SIGINT/SIGTERM, then stops them."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self._shared = shared_block(config.workers)
        self._procs: list[multiprocessing.Process] = []
        # a plain flag, not an Event: a signal handler must not take the lock the main
        # thread may hold inside Event.wait when the signal lands (topology/worldstate.py)
        self._stopping = False

    def _cpu_for(self, index: int) -> int | None:
        cpus = self.config.cpus
        if cpus == ():
            return None
        available = sorted(os.sched_getaffinity(0))
        pool = list(cpus) if cpus else available
        return pool[index % len(pool)]

    def counter_rows(self) -> list[list[int]]:
        width = len(NAMES)
        flat = list(self._shared)
        return [flat[w * width:(w + 1) * width] for w in range(self.config.workers)]

    def totals(self) -> dict[str, int]:
        rows = self.counter_rows()
        return {name: sum(r[k] for r in rows) for k, name in enumerate(NAMES)}

    def _spawn(self, index: int) -> multiprocessing.Process:
        sockets = WorkerSockets(self.config, index)  # raises OSError here, in the parent, if busy
        ctx = multiprocessing.get_context("fork")
        proc = ctx.Process(target=run_worker, name=f"relay-worker-{index}",
                           args=(self.config, index, self._shared, self._cpu_for(index), sockets,
                                 os.getpid()))
        try:
            proc.start()
        finally:
            sockets.close()  # the worker has its own copies
        return proc

    def start(self) -> None:
        """Start the workers; ``PortTaken`` if another process already holds a port."""
        cfg = self.config
        wanted = [cfg.listen] + ([cfg.internal] if cfg.tier == "cluster" and cfg.internal else [])
        if cfg.hop_port:
            wanted += [(cfg.hop_bind, cfg.hop_port + i) for i in range(cfg.workers)]
        stale = port_holders(wanted, exclude={os.getpid()})
        if stale:
            raise PortTaken(stale)
        try:
            for i in range(self.config.workers):
                self._procs.append(self._spawn(i))
        except OSError:
            self.stop()
            raise
        if self.config.metrics:
            registry = CollectorRegistry()
            registry.register(_Collector(self))
            host, port = self.config.metrics
            start_http_server(port, addr=host, registry=registry)
        cfg = self.config
        log_event(
            log, "relay_started", relay=cfg.name, tier=cfg.tier,
            listen=f"{cfg.listen[0]}:{cfg.listen[1]}",
            internal=(f"{cfg.internal[0]}:{cfg.internal[1]}"
                      if cfg.internal and cfg.tier == "cluster" else None),
            workers=cfg.workers, worker_pids=self.worker_pids(), admission=cfg.admission,
            cpus=[self._cpu_for(i) for i in range(cfg.workers)], redis=bool(cfg.redis_url),
            metrics=f"http://{cfg.metrics[0]}:{cfg.metrics[1]}/metrics" if cfg.metrics else None,
            ufrag_dev_secret=is_dev_secret(cfg.secret))
        if is_dev_secret(cfg.secret):
            log_event(log, "ufrag_dev_secret", level=logging.WARNING, relay=cfg.name,
                      note=DEV_SECRET_WARNING)

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def stop(self) -> None:
        self._stopping = True
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            proc.join(timeout=3)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def run(self) -> None:
        """Start, supervise (restart a worker that died), stop on a signal."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: setattr(self, "_stopping", True))
        self.start()
        try:
            while not self._stopping:
                time.sleep(0.5)  # a signal's handler runs within it
                for i, proc in enumerate(self._procs):
                    if not proc.is_alive() and not self._stopping:
                        log_event(log, "worker_died", level=logging.WARNING, worker=i,
                                  worker_pid=proc.pid, exitcode=proc.exitcode)
                        time.sleep(0.2)
                        self._procs[i] = self._spawn(i)
        finally:
            self.stop()
            log_event(log, "relay_stopped", relay=self.config.name,
                      **{k: v for k, v in self.totals().items() if v})
