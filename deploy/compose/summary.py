"""One line about the sessions in a `voiceedge client --results` file (scripts/compose-test).

    python deploy/compose/summary.py RESULTS.jsonl [--gaps]
"""
import json
import statistics
import sys


def main() -> int:
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    ok = [r for r in rows if r.get("ok")]
    setup = sorted(r["setup_ms"] for r in rows if r.get("setup_ms") is not None)
    parts = [f"{len(ok)}/{len(rows)} ok",
             f"echo {sum(bool(r.get('echo_verified')) for r in rows)}",
             f"datachannel {sum(bool(r.get('datachannel_verified')) for r in rows)}",
             "transceivers " + ",".join(sorted({str(r.get('transceiver')) for r in rows}))]
    if setup:
        parts.append(f"setup ms median {statistics.median(setup):.0f} max {setup[-1]:.0f}")
    if "--gaps" in sys.argv:
        for i, r in enumerate(rows):
            gaps = r.get("rx_gaps") or []
            worst = max((g[1] for g in gaps), default=0)
            parts.append(f"s{i}: gaps {[round(g[1]) for g in gaps]} (max {worst:.0f} ms), "
                         f"loss {r.get('loss_pct')} %, reconnections {r.get('reconnections')}")
    print("; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
