"""``voiceedge calibrate``: build a world, prove its links are the configured ones, tear down."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from contextlib import contextmanager, nullcontext

from topology.calibrate import CalibrationReport, calibrate
from topology.preflight import check_world_prerequisites
from voiceedge.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="build an emulated world and check every impaired link",
                       description="Build the emulated world of --regions, probe every impaired "
                                   "direction of every link, compare with the configuration, "
                                   "tear down. Exit status 1 when a path is off.")
    p.add_argument("--regions", default="apac-se,na-east,eu-west",
                   help="region group, region, or comma list (default apac-se,na-east,eu-west)")
    p.add_argument("--clusters", help="cluster regions (default: the catalogue's among them)")
    p.add_argument("--backend", choices=("auto", "netem", "userspace"), default="auto",
                   help="impairment backend (default auto: netem where the kernel has it, "
                        "else userspace)")
    p.add_argument("--count", type=int, default=200, help="probe datagrams per path (default 200)")
    p.add_argument("--rate", type=float, default=100.0, help="probe datagrams/s (default 100)")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.set_defaults(func=run)


def world_spec_of(regions: str, clusters: str | None):
    """The ``WorldSpec`` of a --regions / --clusters pair (groups, regions or comma lists).
    Raises ValueError for an unknown name."""
    from topology.plan import world_spec
    from topology.regions import RegionsCatalog

    catalog = RegionsCatalog.load()
    names = [r.name for r in catalog.resolve(regions)]
    cluster_names = [r.name for r in catalog.resolve(clusters)] if clusters else None
    return world_spec(catalog, names, cluster_names)


def build_and_calibrate(regions: str, clusters: str | None, backend: str | None, count: int,
                        rate: float, say: Callable[[str], None] = lambda msg: None,
                        progress: Callable[[int, int], None] | None = None):
    """Build the world, calibrate it, tear it down; returns (report, world timings, engine
    stats). ``backend``: a name, or None for what the kernel supports. Raises ValueError for
    bad input."""
    from topology.impairment.factory import make_backend
    from topology.world import World

    spec = world_spec_of(regions, clusters)
    names = spec.regions
    impairment = make_backend(backend)
    say(f"impairment backend: {impairment.name}; building {len(names)} regions "
        f"({', '.join(names)}), clusters {', '.join(spec.clusters)}")
    world = World(spec, impairment)
    with world:
        say(f"built in {world.build_seconds:.2f} s; probing {len(world.links) + 1} paths")
        report = calibrate(world, count=count, rate=rate, progress=progress)
        stats = impairment.stats()
    timings = {"build_s": round(world.build_seconds, 2),
               "teardown_s": round(world.teardown_seconds, 2)}
    return report, timings, stats


@contextmanager
def paths_progress(console, description: str = "probing paths"):
    """Yield a ``progress(done, total)`` callback that draws a rich progress bar on
    ``console`` (a ``rich.console.Console``) from its first call to the end of the block, or
    None when the console is not a terminal: a bar redraws itself with control characters,
    which must not reach a file or a pipe."""
    if not console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeElapsedColumn

    bar = Progress(TextColumn("[dim]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console, transient=True)
    tasks: list = []

    def progress(done: int, total: int) -> None:
        if not tasks:  # started late, so what is logged while the world is built stays intact
            bar.start()
            tasks.append(bar.add_task(description, total=total))
        bar.update(tasks[0], completed=done, total=total)

    try:
        yield progress
    finally:
        bar.stop()


def run(args: argparse.Namespace) -> int:
    if args.count < 20 or args.rate <= 0:
        raise UserError("--count must be at least 20 and --rate positive")
    backend = None if args.backend == "auto" else args.backend
    check_world_prerequisites(backend)
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True)
    say = (lambda msg: None) if args.json else (
        lambda msg: console.print(f"[dim]… {escape(msg)}[/dim]"))
    bar = nullcontext() if args.json else paths_progress(console)
    try:
        with bar as progress:
            report, timings, stats = build_and_calibrate(args.regions, args.clusters, backend,
                                                         args.count, args.rate, say, progress)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        json.dump(report.to_dict() | {"timings": timings, "engine": _engine_summary(stats)},
                  sys.stdout, indent=2)
        print()
    else:
        print_report(report, timings)
    return 0 if report.ok else 1


def _engine_summary(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if not isinstance(v, (dict, list))}


def print_report(report: CalibrationReport, timings: dict | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    verdict = "[green]PASS[/green]" if report.ok else "[red]FAIL[/red]"
    table = Table(title=f"calibration ({report.backend} backend): {verdict}")
    for col in ("path", "hosts", "delay ms cfg / meas", "jitter ms cfg / meas",
                "loss % cfg / meas", "recv", "ok"):
        table.add_column(col, justify="right" if col != "path" else "left")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for p in report.paths:
        mark = lambda good: "" if good else "[red]![/red]"  # noqa: E731
        table.add_row(
            f"{p.kind} {p.src}->{p.dst}", f"{p.sender}->{p.receiver}",
            f"{p.expected_mean_ms:.2f} / {fmt(p.mean_ms)}{mark(p.mean_ok)}",
            f"{p.expected_sd_ms:.2f} / {fmt(p.sd_robust_ms)}{mark(p.sd_ok)}",
            f"{p.expected_loss_pct:.2f} / {p.loss_pct:.2f}{mark(p.loss_ok)}",
            f"{p.received}/{p.sent}", "yes" if p.ok else "[red]NO[/red]")
    console = Console(width=max(Console().width, 120))
    console.print(table)
    if timings:
        console.print(f"world built in {timings['build_s']} s, torn down in "
                      f"{timings['teardown_s']} s; unimpaired path {report.baseline_ms} ms")
