"""The names of the client types, as every session's ``client_type`` (sessions.csv) carries
them: the one definition the clients (services/client, services/browser) and the scenarios'
registry of client types (scenarios/clients) share. The analysis reads them from the results."""
from __future__ import annotations

AIORTC = "aiortc"      # the project's aiortc client (voiceedge client): full and light sessions
CHROMIUM = "chromium"  # headless Chromium pages (voiceedge browser)
