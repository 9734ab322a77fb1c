"""What a results folder's writers (topology, scenarios, the clients) and its reader (analysis)
agree on, in one leaf module (it imports nothing of the project): the analysis reads results
files only, so the names and facts both sides need are defined here once."""
from __future__ import annotations

# Per architecture, next to its pcaps (topology/capture.py): every capture point's host, role,
# region, interfaces, size and cost.
CAPTURES_FILE = "captures.json"
# Next to the pcaps: a client host's received RTP packets as its client saw them in user space
# (``voiceedge client --rx-log``), after the impairment on the host's own ingress.
RX_LOG_SUFFIX = ".rx.jsonl"
# The shortest media gap the clients record (services/gaps.py): three 20 ms packet
# times, at least two packets in a row missing or late. A shorter silence is in no results file.
GAP_MIN_MS = 60.0
