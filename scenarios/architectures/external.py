"""Bring your own edge: an architecture that is not this project's code.

A scenario declares it under ``external:`` (docs/scenarios.md, "Bring your own edge"): commands
started on each cluster host (and optionally on each client region's edge host) with the
host's addresses substituted, and the URL of its signaling per cluster. It must speak WHIP's
offer/answer (RFC 9725): ``POST`` of an SDP offer (``Content-Type: application/sdp``)
answered ``201 Created`` with the SDP answer and a ``Location``; ``DELETE`` of that location
ends the call. The project's geo-steering front forwards each call to the chosen cluster's URL
(services/signaling/server.py); the clients, floors, captures, port count and report are the
same as for every other architecture.

``cluster`` (and ``ingress``) is one command or a list of them, one process each; a command
is a shell line (run by ``/bin/sh -c``), an argv list, or a mapping
``{run: <line or argv list>, ready: "HOST:PORT"}``: the edge waits until HOST:PORT accepts a TCP
connection from inside the host. The last cluster command is ready by default when the
signaling URL's port accepts; a command without a check must stay alive for half a second.
"""
from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from scenarios.architectures.base import (BACKBONE, COMMON_PATH, PER_SESSION, PUBLIC, SHARED,
                                          VERIFIABLE, Architecture)
from services.client.verify import AUDIO

if TYPE_CHECKING:
    from scenarios.edge import ClusterPlan, Edge, IngressPlan

# Placeholders a cluster command (and the signaling URL) may use, and an ingress command's.
CLUSTER_FIELDS = ("name", "cluster", "cluster_id", "public", "internal", "logs", "python",
                  "voiceedge")
INGRESS_FIELDS = ("name", "region", "vip", "backbone", "logs", "python", "voiceedge")
SIGNALING_FIELDS = ("cluster", "cluster_id", "public", "internal")
_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}")
_KEYS = {"label", "colour", "cluster", "ingress", "signaling", "media_link", "ports",
         "verifies", "capacity"}
_SPARE_COLOUR = "#D55E00"


@dataclass(frozen=True)
class Command:
    """One process of an external edge on a host: its argv template, or a shell line."""

    argv: tuple[str, ...] = ()
    shell: str = ""
    ready: str = ""           # "HOST:PORT" template; "" = no TCP check

    def render(self, values: dict) -> list[str]:
        if self.shell:
            return ["/bin/sh", "-c", self.shell.format(**values)]
        return [a.format(**values) for a in self.argv]


@dataclass(frozen=True)
class External(Architecture):
    """An external edge (see the module's docstring)."""

    cluster_commands: tuple[Command, ...] = ()
    ingress_commands: tuple[Command, ...] = ()
    signaling: str = ""       # URL template of a cluster's WHIP endpoint
    capacity: int = 500       # calls a cluster takes at once (the front counts its own)

    # ------------------------------------------------------------ the scenario's syntax

    @classmethod
    def parse(cls, name: str, doc) -> "External":
        """From a scenario's ``external: {NAME: {...}}`` entry; ValueError (one line) if bad."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{name!r}: a name of lower-case letters, digits and -")
        if not isinstance(doc, dict):
            raise ValueError(f"{name}: a mapping with cluster and signaling")
        unknown = set(doc) - _KEYS
        if unknown:
            raise ValueError(f"{name}: unknown field(s) {', '.join(sorted(unknown))} "
                             f"(known: {', '.join(sorted(_KEYS))})")
        if "cluster" not in doc or "signaling" not in doc:
            raise ValueError(f"{name}: needs cluster (the commands on each cluster host) and "
                             f"signaling (the URL of its WHIP endpoint)")
        cluster = _commands(name, "cluster", doc["cluster"], CLUSTER_FIELDS)
        ingress = (_commands(name, "ingress", doc["ingress"], INGRESS_FIELDS)
                   if doc.get("ingress") is not None else ())
        signaling = doc["signaling"]
        if not isinstance(signaling, str):
            raise ValueError(f"{name}: signaling: a URL template such as "
                             f"http://{{internal}}:8900/whip")
        _check_template(name, "signaling", signaling, SIGNALING_FIELDS)
        url = urlsplit(signaling.format(**_dummy(SIGNALING_FIELDS)))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"{name}: signaling: an http:// or https:// URL ({signaling!r})")
        try:
            url.port
        except ValueError:
            raise ValueError(f"{name}: signaling: a bad port in {signaling!r}") from None
        media_link = doc.get("media_link", BACKBONE if ingress else PUBLIC)
        if media_link not in (PUBLIC, BACKBONE):
            raise ValueError(f"{name}: media_link: {PUBLIC} or {BACKBONE} ({media_link!r})")
        ports = doc.get("ports", SHARED)
        if ports not in (SHARED, PER_SESSION):
            raise ValueError(f"{name}: ports: {SHARED} or {PER_SESSION} ({ports!r})")
        verifies = doc.get("verifies", [AUDIO])
        if (not isinstance(verifies, list) or not verifies
                or not set(verifies) <= set(VERIFIABLE)):
            raise ValueError(f"{name}: verifies: a list from {', '.join(VERIFIABLE)} "
                             f"({verifies!r})")
        capacity = doc.get("capacity", 500)
        if not isinstance(capacity, int) or isinstance(capacity, bool) or not 1 <= capacity:
            raise ValueError(f"{name}: capacity: calls per cluster, 1 or more ({capacity!r})")
        colour = doc.get("colour", _SPARE_COLOUR)
        if not isinstance(colour, str) or not re.fullmatch(r"#[0-9a-fA-F]{6}", colour):
            raise ValueError(f"{name}: colour: #rrggbb ({colour!r})")
        label = doc.get("label", name)
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"{name}: label: a non-empty text")
        path = (COMMON_PATH
                + tuple(f"{name}-ingress-{{client}}-{i}" for i in range(1, len(ingress) + 1))
                + tuple(f"{name}-{{cluster}}-{i}" for i in range(1, len(cluster) + 1)))
        return cls(name=name, label=label.strip(), colour=colour, order=1000,
                   media_link=media_link, ports=ports, ingress=bool(ingress), external=True,
                   verifies=tuple(dict.fromkeys(verifies)), path=path,
                   cluster_commands=cluster, ingress_commands=ingress, signaling=signaling,
                   capacity=capacity)

    # ------------------------------------------------------------ planning and starting

    def signaling_url(self, cluster: "ClusterPlan") -> str:
        return self.signaling.format(cluster=cluster.name, cluster_id=cluster.cluster_id,
                                     public=cluster.public, internal=cluster.internal)

    def front_route(self, edge: "Edge", cluster: "ClusterPlan") -> dict:
        return {"whip": [self.signaling_url(cluster)], "capacity": self.capacity}

    def start_cluster(self, edge: "Edge", cluster: "ClusterPlan") -> None:
        values = {"name": self.name, "cluster": cluster.name, "cluster_id": cluster.cluster_id,
                  "public": cluster.public, "internal": cluster.internal,
                  **_common(edge)}
        url = urlsplit(self.signaling_url(cluster))
        port = url.port or (443 if url.scheme == "https" else 80)
        last = len(self.cluster_commands)
        for i, command in enumerate(self.cluster_commands, start=1):
            ready = command.ready.format(**values) if command.ready else (
                f"{url.hostname}:{port}" if i == last else "")
            edge.start_external(f"{self.name}-{cluster.name}-{i}", cluster.host,
                                command.render(values), ready)

    def start(self, edge: "Edge") -> None:
        for cluster in edge.plan.clusters:
            self.start_cluster(edge, cluster)
        for ingress in edge.plan.ingresses:
            self.start_ingress(edge, ingress)
        edge.start_fronts()

    def start_ingress(self, edge: "Edge", ingress: "IngressPlan") -> None:
        values = {"name": self.name, "region": ingress.region, "vip": ingress.listen,
                  "backbone": ingress.hop_bind, **_common(edge)}
        for i, command in enumerate(self.ingress_commands, start=1):
            edge.start_external(f"{self.name}-ingress-{ingress.region}-{i}", ingress.host,
                                command.render(values),
                                command.ready.format(**values) if command.ready else "")

    def facts(self) -> dict:
        return super().facts() | {"signaling": self.signaling}


def _common(edge: "Edge") -> dict:
    return {"logs": str(edge.logs), "python": sys.executable,
            "voiceedge": f"{shlex.quote(sys.executable)} -m voiceedge"}


def _dummy(fields) -> dict:
    return {f: "1" if f == "cluster_id" else "x" for f in fields}


def _check_template(name: str, where: str, text: str, fields) -> None:
    try:
        text.format(**_dummy(fields))
    except KeyError as exc:
        raise ValueError(f"{name}: {where}: unknown placeholder {{{exc.args[0]}}} "
                         f"(known: {', '.join('{' + f + '}' for f in fields)})") from None
    except (ValueError, IndexError):
        raise ValueError(f"{name}: {where}: braces must be placeholders such as "
                         f"{{{fields[0]}}} ({text!r}; write {{{{ and }}}} for literal ones)") \
            from None


def _commands(name: str, where: str, raw, fields) -> tuple[Command, ...]:
    """One command, or a list of commands (the module's docstring)."""
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for n, item in enumerate(items, start=1):
        at = f"{where}[{n}]" if len(items) > 1 else where
        ready = ""
        if isinstance(item, dict):
            if set(item) - {"run", "ready"} or "run" not in item:
                raise ValueError(f"{name}: {at}: a mapping has run and optionally ready")
            ready = item.get("ready") or ""
            if not isinstance(ready, str) or not re.fullmatch(r".+:\{?\w+\}?", ready):
                raise ValueError(f"{name}: {at}: ready: HOST:PORT ({ready!r})")
            _check_template(name, f"{at}: ready", ready, fields)
            item = item["run"]
        if isinstance(item, str) and item.strip():
            _check_template(name, at, item, fields)
            out.append(Command(shell=item.strip(), ready=ready))
        elif (isinstance(item, list) and item
              and all(isinstance(a, str) and a for a in item)):
            for a in item:
                _check_template(name, at, a, fields)
            out.append(Command(argv=tuple(item), ready=ready))
        else:
            raise ValueError(f"{name}: {at}: a shell line, an argv list of strings, or "
                             f"{{run: ..., ready: HOST:PORT}} ({item!r})")
    if not out:
        raise ValueError(f"{name}: {where}: at least one command")
    return tuple(out)
