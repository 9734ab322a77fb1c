"""The cluster relay's routes file for Kubernetes (deploy/k8s; docs/deployment.md).

The relay's routes (services/relay/config.py) map a transceiver id to "IP:port": it builds a
sockaddr from each address, so names are not accepted. Transceiver i is StatefulSet pod i, whose
stable DNS name (the headless Service, publishNotReadyAddresses) this resolves to its pod IP:

    python3 render-routes.py --out /run/voiceedge/routes.toml   # before the relay starts
    python3 render-routes.py --check /run/voiceedge/routes.toml # the relay's liveness probe

A pod that is rescheduled comes back with another IP, which the relay would not learn: --check
exits 1 when a transceiver's name now resolves to another address than the file says (or one
missing from the file now resolves), so the kubelet restarts the relay container, which renders
the file again; with Redis its flows come back at once (docs/relay.md). A name that does not
resolve right now (its pod is being replaced) is not a change: the old route stays until the
new address shows.

Settings come from the environment (ConfigMap voiceedge-edge, downward API): CLUSTER_ID,
TRANSCEIVERS, TRANSCEIVER_SERVICE, TRANSCEIVER_MEDIA_PORT, POD_NAMESPACE, and optionally
CLUSTER_DOMAIN (default cluster.local). Standard library only: it runs in the voiceedge image.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import time


def names(env) -> dict[int, str]:
    """Transceiver id -> its pod's DNS name. The id is the pod ordinal (ids 0..4095)."""
    count = int(env["TRANSCEIVERS"])
    if not 1 <= count <= 4096:
        raise ValueError("TRANSCEIVERS must be 1..4096 (transceiver ids are 12 bits)")
    svc, ns = env["TRANSCEIVER_SERVICE"], env["POD_NAMESPACE"]
    domain = env.get("CLUSTER_DOMAIN", "cluster.local")
    return {i: f"{svc}-{i}.{svc}.{ns}.svc.{domain}" for i in range(count)}


def resolve(name: str) -> str | None:
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_DGRAM)
    except socket.gaierror:
        return None
    return sorted(info[4][0] for info in infos)[0] if infos else None


def resolve_all(env) -> dict[int, str | None]:
    return {tid: resolve(name) for tid, name in names(env).items()}


def render(env, addresses: dict[int, str | None]) -> str:
    port = int(env["TRANSCEIVER_MEDIA_PORT"])
    lines = [f"cluster_id = {int(env['CLUSTER_ID'])}", "[routes]"]
    lines += [f'{tid} = "{ip}:{port}"' for tid, ip in sorted(addresses.items()) if ip]
    return "\n".join(lines) + "\n"


def read_routes(path: str) -> dict[int, str]:
    routes = {}
    for line in open(path):
        m = re.match(r'\s*(\d+)\s*=\s*"([^"]+):\d+"', line)
        if m:
            routes[int(m.group(1))] = m.group(2)
    return routes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", metavar="FILE", help="write the routes file")
    g.add_argument("--check", metavar="FILE", help="exit 1 when FILE is out of date")
    p.add_argument("--wait", type=float, default=60.0, metavar="S",
                   help="--out: wait up to S seconds for every transceiver's name (default 60)")
    args = p.parse_args(argv)
    env = os.environ
    if args.check:
        old = read_routes(args.check)
        changed = {tid: ip for tid, ip in resolve_all(env).items() if ip and old.get(tid) != ip}
        if changed:
            print(f"routes out of date: {changed} (file: {old})", file=sys.stderr)
            return 1
        return 0
    deadline = time.monotonic() + args.wait
    while True:
        addresses = resolve_all(env)
        missing = [tid for tid, ip in addresses.items() if not ip]
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    if len(missing) == len(addresses):
        print(f"no transceiver resolves: {list(names(env).values())}", file=sys.stderr)
        return 1
    if missing:
        print(f"transceivers {missing} do not resolve yet: left out until the liveness "
              "check restarts the relay", file=sys.stderr)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(render(env, addresses))
    os.replace(tmp, args.out)
    print(open(args.out).read(), end="", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
