"""``voiceedge bench hostile``: hostile input against a live edge, part by part.

Parts (each starts its own edge in a lab namespace and stops it; docs/hostile.md):

- ``fuzz``       a million hostile datagrams (scapy + hypothesis) at the relay, with and
                 without pending flows, while live calls run;
- ``flood``      10,000 first packets per second from many sources while 20 calls run;
- ``signaling``  oversized, slow, mistyped and pathological offers, 1,000 junk POSTs at once;
- ``hygiene``    1,000 complete and 1,000 half-way sessions: no growth in any service.

Every part reports ``violations`` (rules that broke); the command exits 1 if any part has one.
"""
from __future__ import annotations

import importlib
import json
import sys
import time
from dataclasses import asdict, dataclass

from voiceedge.errors import UserError


@dataclass(frozen=True)
class Part:
    module: str
    config: str  # the part's config dataclass (defaults: the full run; quick(): seconds)


PARTS = {
    "fuzz": Part("bench.hostile.fuzz", "FuzzConfig"),
    "flood": Part("bench.hostile.flood", "FloodConfig"),
    "signaling": Part("bench.hostile.signaling", "SignalingAbuseConfig"),
    "hygiene": Part("bench.hostile.hygiene", "HygieneConfig"),
}


def run_parts(names: list[str], quick: bool, say=lambda msg: None) -> dict:
    """Run the named parts in order; JSON-ready results by part name."""
    results = {}
    for name in names:
        part = PARTS[name]
        module = importlib.import_module(part.module)
        config_cls = getattr(module, part.config)
        config = config_cls.quick() if quick else config_cls()
        say(f"{name}: starting")
        started = time.monotonic()
        result = module.run(config, say=lambda msg, n=name: say(f"{name}: {msg}"))
        result.setdefault("config", asdict(config))
        result["wall_s"] = round(time.monotonic() - started, 1)
        results[name] = result
    return results


def add_parser(sub) -> None:
    p = sub.add_parser("hostile", help="hostile input against a live edge (fuzz, flood, "
                                       "signaling abuse, resource hygiene)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), metavar="LIST",
                   help=f"which parts, in order (default {','.join(PARTS)})")
    p.add_argument("--quick", action="store_true",
                   help="the seconds-long subsets that make test runs, not the full benchmark")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.add_argument("--out", metavar="FILE", help="also write the JSON to FILE")
    p.set_defaults(func=_main)


def _main(args) -> int:
    names = [n.strip() for n in args.parts.split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown or not names:
        raise UserError(f"--parts: unknown part(s) {', '.join(unknown) or '(none given)'}; "
                        f"choose from {', '.join(PARTS)}")
    if args.json:
        say = lambda msg: None  # noqa: E731
    else:
        from rich.console import Console
        console = Console(stderr=True)
        say = lambda msg: console.print(f"[dim]… {msg}[/dim]")  # noqa: E731
    try:
        results = run_parts(names, args.quick, say)
    except (ValueError, RuntimeError, OSError) as exc:
        raise UserError(f"bench hostile: {exc}") from None
    text = json.dumps(results, indent=2, default=str)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json:
        print(text)
    else:
        for name, result in results.items():
            module = importlib.import_module(PARTS[name].module)
            print(f"\n## {name} ({result['wall_s']:g} s)")
            for line in module.lines(result):
                print(line)
            for v in result.get("violations", []):
                print(f"VIOLATION: {v}")
    broken = sum(len(r.get("violations", [])) for r in results.values())
    if broken and not args.json:
        print(f"\n{broken} violation(s)", file=sys.stderr)
    return 1 if broken else 0
