"""The project's aiortc client (``voiceedge client``, docs/client.md): one process per client
region; ``full_clients_per_region`` of its sessions decode what they receive (full), the rest
read RTP headers only (light)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from scenarios.clients.base import ClientType, RegionClients
from services.clienttypes import AIORTC
from services.mediapaths import PYTHON

if TYPE_CHECKING:
    from scenarios.spec import Scenario


class AiortcClient(ClientType):
    name = AIORTC
    process = "client"
    results_suffix = ""

    def argv(self, scenario: "Scenario", where: RegionClients, sessions: int, index_base: int,
             verifies: tuple[str, ...] | None = None, extra_args: tuple[str, ...] = ()
             ) -> list[str]:
        sc = scenario
        return ["client", "--url", where.url, "-n", str(sessions), "--rate", str(sc.start_rate),
                "--full-clients", str(min(sc.full_clients_per_region, sessions)),
                # each region's set-ups and full sessions at their own times: at one phase,
                # every region set up its i-th call at the same instant
                *(["--phase", f"{where.number / where.regions:g}"] if where.number else []),
                "--duration", str(sc.call_duration_s),
                "--media-timeout", str(sc.media_timeout_s),
                "--reconnect-attempts", str(sc.reconnect_attempts),
                *(["--light-path", sc.light_path] if sc.light_path != PYTHON else []),
                *(["--index-base", str(index_base)] if index_base else []),
                *(["--retry-setup"] if where.retry_setup else []),
                *(["--start-at", f"{where.start_at_unix:.6f}"]
                  if where.start_at_unix is not None else []),
                *(["--start-file", str(where.start_file)] if where.start_file is not None
                  else []),
                *(["--rx-log", str(where.rx_log)] if where.rx_log is not None else []),
                *self._conversation(sc, where), *self._credential(where),
                *self._verify(verifies), *self._outputs(where), *extra_args]
