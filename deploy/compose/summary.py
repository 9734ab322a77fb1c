"""One line about the sessions in a `voiceedge client --results` file (scripts/compose-test).

    python deploy/compose/summary.py RESULTS.jsonl [--gaps] [--survived MAX_GAP_MS]

--gaps: each session's media gaps (ms, >= 60 ms between received RTP packets), loss and
reconnections. --survived MAX_GAP_MS: the check of a restart the calls must survive; exit 1,
with the reasons at the end of the line, unless every session is ok, none called again
(reconnections 0: media resumed on the same call) and no media gap exceeded MAX_GAP_MS.
"""
import argparse
import json
import statistics
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results")
    p.add_argument("--gaps", action="store_true")
    p.add_argument("--survived", type=float, metavar="MAX_GAP_MS")
    args = p.parse_args()
    with open(args.results) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    ok = [r for r in rows if r.get("ok")]
    setup = sorted(r["setup_ms"] for r in rows if r.get("setup_ms") is not None)
    parts = [f"{len(ok)}/{len(rows)} ok",
             f"echo {sum(bool(r.get('echo_verified')) for r in rows)}",
             f"datachannel {sum(bool(r.get('datachannel_verified')) for r in rows)}",
             "transceivers " + ",".join(sorted({str(r.get('transceiver')) for r in rows}))]
    if setup:
        parts.append(f"setup ms median {statistics.median(setup):.0f} max {setup[-1]:.0f}")
    worst = {i: max((g[1] for g in r.get("rx_gaps") or []), default=0.0) for i, r in enumerate(rows)}
    if args.gaps:
        for i, r in enumerate(rows):
            gaps = r.get("rx_gaps") or []
            parts.append(f"s{i}: gaps {[round(g[1]) for g in gaps]} (max {worst[i]:.0f} ms), "
                         f"loss {r.get('loss_pct')} %, reconnections {r.get('reconnections')}")
    failed = []
    if args.survived is not None:
        if not rows or len(ok) < len(rows):
            failed.append(f"{len(rows) - len(ok)} of {len(rows)} sessions not ok")
        called_again = sum(1 for r in rows if r.get("reconnections"))
        if called_again:
            failed.append(f"{called_again} sessions called again")
        too_long = [f"s{i} {ms:.0f} ms" for i, ms in worst.items() if ms > args.survived]
        if too_long:
            failed.append(f"gaps over {args.survived:.0f} ms: {', '.join(too_long)}")
        parts.append("NOT SURVIVED: " + "; ".join(failed) if failed
                     else f"survived (same calls, max gap {max(worst.values()):.0f} ms <= {args.survived:.0f})")
    print("; ".join(parts))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
