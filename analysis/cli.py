"""``voiceedge report``: the report of a results folder, or what moved between two runs."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from voiceedge.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="plotted HTML/Markdown report of a results folder, or "
                                      "compare two runs",
                       description="Write report.html (self-contained), report.md and plots/ "
                                   "for a results folder and print their paths (for a sweep's "
                                   "folder, sweep_report.html and sweep_report.md); or, with "
                                   "--compare OLD NEW, print in Markdown what moved between two "
                                   "runs (changes whose 95%% CIs do not overlap are flagged).")
    p.add_argument("results", nargs="?", metavar="RESULTS_DIR", type=Path,
                   help="a results folder written by `voiceedge scenario` or `voiceedge sweep`")
    p.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), type=Path,
                   help="compare two results folders instead")
    p.add_argument("--out", metavar="DIR", type=Path,
                   help="where the report goes (default: RESULTS_DIR itself)")
    p.add_argument("--resamples", type=int, default=2000,
                   help="bootstrap resamples per confidence interval (default 2000)")
    p.add_argument("--json", action="store_true",
                   help="print only JSON on stdout: the summary, findings and report paths; "
                        "with --compare, every compared statistic and the flagged changes")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from analysis.compare import compare, compare_json
    from analysis.jsonout import dumps
    from analysis.load import ResultsError
    from analysis.report import report
    from analysis.stats import Bootstrap

    if (args.results is None) == (args.compare is None):
        raise UserError("give either RESULTS_DIR or --compare OLD NEW")
    if args.compare and args.out:
        raise UserError("--out applies to a report, not to --compare")
    if args.resamples < 100:
        raise UserError(f"--resamples {args.resamples}: use at least 100")
    boot = Bootstrap(resamples=args.resamples)
    try:
        if args.compare:
            print(dumps(compare_json(*args.compare, boot=boot)) if args.json
                  else compare(*args.compare, boot=boot))
            return 0
        if (args.results / "sweep.json").is_file():  # a sweep's folder: its sweep report
            return _sweep(args, boot)
        written = report(args.results, args.out, boot=boot)
    except ResultsError as exc:
        raise UserError(str(exc)) from None
    if not written.results.complete:
        print(f"{args.results}: incomplete run: {written.results.missing_text()}; reported "
              f"what was measured", file=sys.stderr)
    if args.json:
        print(dumps(written.to_dict(), ndigits=4))
    else:
        print(written.html)
        print(written.markdown)
    return 0


def _sweep(args: argparse.Namespace, boot) -> int:
    from analysis.jsonout import dumps
    from analysis.sweepreport import sweep_report

    written = sweep_report(args.results, args.out, boot=boot)
    if args.json:
        print(dumps(written.to_dict(), ndigits=4))
    else:
        print(written.paths["html"])
        print(written.paths["markdown"])
    return 0
