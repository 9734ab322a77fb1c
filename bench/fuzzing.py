"""What the native extensions' fuzzers share (bench/fuzz_mediaplane.py, bench/fuzz_impairment.py):
a sanitizer (or coverage) build of one extension of pyproject.toml, loading that build in place
of the in-tree one, the environment of the fuzzing child (atheris's ASan+libFuzzer runtime
preloaded), and the summary of a libFuzzer run.
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV_SO = "VOICEEDGE_FUZZ_SO"        # the child: the build to load
ENV_STATS = "VOICEEDGE_FUZZ_STATS"  # the child: where its tallies go

FUZZ_FLAGS = ["-fsanitize=address,undefined,fuzzer-no-link", "-fno-sanitize-recover=all",
              "-fno-omit-frame-pointer", "-g", "-O1"]
COVERAGE_FLAGS = ["--coverage", "-O0", "-g"]


@dataclass(frozen=True)
class Target:
    """One extension to fuzz: its module name ends with ``suffix``; builds go under ``work``;
    $``source_env``, when set, names another copy of its main C file (its first source) to
    build; ``tool`` prefixes errors."""

    suffix: str
    work: Path
    source_env: str
    tool: str

    def extension(self) -> dict:
        """The extension's [[tool.setuptools.ext-modules]] entry of pyproject.toml."""
        with open(REPO / "pyproject.toml", "rb") as f:
            for ext in tomllib.load(f)["tool"]["setuptools"]["ext-modules"]:
                if ext["name"].endswith(self.suffix):
                    if os.environ.get(self.source_env):
                        ext = dict(ext, sources=[os.environ[self.source_env], *ext["sources"][1:]])
                    return ext
        raise SystemExit(f"{self.tool}: no {self.suffix[1:]} extension in pyproject.toml")

    def source(self) -> Path:
        """The main C file (the module's; the others are its parts)."""
        return self.sources()[0]

    def sources(self) -> list[Path]:
        return [REPO / s for s in self.extension()["sources"]]

    def sources_sha256(self) -> str:
        """One digest over every source file and the headers beside them."""
        digest = hashlib.sha256()
        for path in self.sources() + sorted({h for s in self.sources() for h in s.parent.glob("*.h")}):
            digest.update(path.read_bytes())
        return digest.hexdigest()[:16]

    def build(self, kind: str) -> Path:
        """The extension built for ``kind`` ("fuzz": clang with libFuzzer's instrumentation
        and ASan+UBSan, cached by source and flags; "coverage": gcc --coverage, always fresh)."""
        ext = self.extension()
        sources = [str(s) for s in self.sources()]
        libs = ["-l" + lib for lib in ext.get("libraries", [])]
        flags = [f for f in ext.get("extra-compile-args", []) if f.startswith("-ffp-")]
        include = "-I" + sysconfig.get_paths()["include"]
        name = ext["name"].rpartition(".")[2] + sysconfig.get_config_var("EXT_SUFFIX")
        if kind == "fuzz":
            if not shutil.which("clang"):
                raise SystemExit(f"{self.tool}: needs clang (Debian: apt-get install clang)")
            tag = hashlib.sha256((self.sources_sha256() + " ".join(FUZZ_FLAGS + flags + libs)).encode()
                                 + subprocess.run(["clang", "--version"], capture_output=True).stdout
                                 ).hexdigest()[:16]
            out = self.work / f"so-{tag}" / name
            if not out.exists():
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = out.with_name(f".{name}.{os.getpid()}")
                built = subprocess.run(["clang", "-shared", "-fPIC", *FUZZ_FLAGS, *flags, include,
                                        *sources, *libs, "-o", str(tmp)])
                if built.returncode:   # clang said why, above
                    raise SystemExit(f"{self.tool}: the sanitizer build failed (Debian: the "
                                     "runtimes are in libclang-rt-14-dev; `make fuzz` installs "
                                     "them)")
                os.replace(tmp, out)
            return out
        out_dir = Path(tempfile.mkdtemp(prefix=f"voiceedge-{self.tool}-coverage-"))
        objs = [str(out_dir / (Path(source).stem + ".o")) for source in sources]
        for source, obj in zip(sources, objs):
            subprocess.run(["gcc", "-c", "-fPIC", *COVERAGE_FLAGS, *flags, include, source,
                            "-o", obj], check=True)
        subprocess.run(["gcc", "-shared", "--coverage", *objs, *libs, "-o", str(out_dir / name)],
                       check=True)
        return out_dir / name

    def load(self, path: str):
        """Import the build at ``path`` as the extension's module (in place of the in-tree
        one) and make sure it is the one mapped."""
        name = self.extension()["name"]
        if name in sys.modules:
            raise SystemExit(f"{self.tool}: {name} was imported before the build to fuzz")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
        parent, _, leaf = name.rpartition(".")
        setattr(importlib.import_module(parent), leaf, module)
        in_tree = os.path.realpath(REPO.joinpath(*name.split(".")).as_posix() +
                                   sysconfig.get_config_var("EXT_SUFFIX"))
        with open("/proc/self/maps") as f:
            maps = f.read()
        if module.__file__ != path or path not in maps or in_tree in maps:
            raise SystemExit(f"{self.tool}: {name} is not the build at {path}")
        return module


def files(paths: list[str]) -> list[str]:
    """The files named, folders expanded (sorted)."""
    out = []
    for p in map(Path, paths):
        out += sorted(str(f) for f in p.iterdir() if f.is_file()) if p.is_dir() else [str(p)]
    return out


def preload() -> str:
    spec = importlib.util.find_spec("atheris")
    if spec is None:
        raise SystemExit("fuzzing needs atheris (.venv/bin/pip install atheris; make fuzz)")
    return str(Path(spec.origin).parent.parent / "asan_with_fuzzer.so")


def child_env(so: Path, stats: Path, sanitizers: bool = True, pymalloc: bool = False) -> dict:
    """The fuzzing or replaying child's environment: the build to load, where its tallies go,
    the sanitizer runtime, and (unless ``pymalloc``) every Python buffer from malloc, where
    ASan sees it."""
    env = dict(os.environ, **{ENV_SO: str(so), ENV_STATS: str(stats)},
               PYTHONMALLOC="pymalloc" if pymalloc else "malloc")
    if sanitizers:
        env.update(LD_PRELOAD=preload(),
                   ASAN_OPTIONS="detect_leaks=0:handle_abort=1:allocator_may_return_null=0",
                   UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
        symbolizer = shutil.which("llvm-symbolizer")
        if symbolizer:
            env["ASAN_SYMBOLIZER_PATH"] = symbolizer
    return env


def summary(log: list[str], stats: Path, wall: float, rc: int, artifacts: Path, before: set) -> dict:
    """A libFuzzer run's figures, read from its log, with the harness's tallies and any new
    crash files."""
    text = "".join(log)
    out: dict = {"exit": rc, "wall_s": round(wall, 1)}
    done = re.findall(r"Done (\d+) runs in (\d+) second", text)
    status = re.findall(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+).*?exec/s: (\d+)",
                        text, re.M)
    for key in ("number_of_executed_units", "average_exec_per_sec", "new_units_added",
                "slowest_unit_time_sec", "peak_rss_mb"):
        m = re.search(rf"stat::{key}:\s*(\d+)", text)
        if m:
            out[key] = int(m.group(1))
    if status:
        n, cov, ft, corp, size, eps = status[-1]
        out.update(inputs=int(n), cov=int(cov), ft=int(ft), corpus=int(corp), corpus_size=size)
    if done:
        out["inputs"], out["fuzz_s"] = int(done[-1][0]), int(done[-1][1])
    if "inputs" in out:
        out["inputs_per_s_wall"] = round(out["inputs"] / wall, 1)
    out["crashes"] = sorted(str(p) for p in set(artifacts.glob("*")) - before)
    try:
        out["harness"] = json.loads(stats.read_text())
    except (OSError, ValueError):
        pass
    return out


class Tally(dict):
    """What a harness's inputs did, summed over the run: ``add`` as they go, ``inputs``
    counted by the harness; ``dump`` writes both to $ENV_STATS for the parent's summary (at
    most every 5 s unless ``force``, replacing the file whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs = 0
        self._dumped = 0.0

    def add(self, key: str, n: int = 1) -> None:
        self[key] = self.get(key, 0) + n

    def dump(self, force: bool = False) -> None:
        path, now = os.environ.get(ENV_STATS), time.monotonic()
        if path and (force or now - self._dumped > 5):
            self._dumped = now
            with open(path + ".tmp", "w") as f:
                json.dump(dict(self, inputs=self.inputs), f)
            os.replace(path + ".tmp", path)


class InputReader:
    """A fuzz input consumed front to back; ``EOFError`` once it is spent (the harness's
    program ends there)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise EOFError
        self.pos += 1
        return self.data[self.pos - 1]

    def take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out


@dataclass(frozen=True)
class Harness:
    """A fuzzer's own parts: ``python -m MODULE --child fuzz|replay`` loads the build, makes
    the harness's ``world`` of it (what lives across inputs; its ``tally`` is a ``Tally``) and
    runs ``run_input(world, data)`` on each input; ``seeds`` start an empty corpus;
    ``regressions`` are inputs that once broke an invariant (none by default)."""

    target: Target
    module: str
    doc: str
    seeds: Callable[[], list[bytes]]
    world: Callable[[object], object]
    run_input: Callable[[object, bytes], None]
    regressions: Callable[[], dict[str, bytes]] = dict


def one_input(h: Harness, world, data: bytes) -> None:
    h.run_input(world, data)
    world.tally.inputs += 1
    world.tally.dump()


def child_fuzz(h: Harness, libfuzzer_args: list[str]) -> None:
    module = h.target.load(os.environ[ENV_SO])
    import atheris
    world = h.world(module)
    print(f"{h.target.tool}: fuzzing {module.__name__} from {module.__file__}", file=sys.stderr,
          flush=True)
    # libFuzzer ends with exit(), so Python's atexit never runs: the last tallies from libc's
    final = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: world.tally.dump(force=True))
    ctypes.CDLL(None).__cxa_atexit(final, None, None)
    child_fuzz.keep = final
    atheris.Setup([sys.argv[0], *libfuzzer_args], functools.partial(one_input, h, world))
    atheris.Fuzz()


def child_replay(h: Harness, paths: list[str]) -> None:
    world = h.world(h.target.load(os.environ[ENV_SO]))
    failed = 0
    for path in paths:
        try:
            one_input(h, world, Path(path).read_bytes())
        except Exception as e:   # noqa: BLE001 - every input is run and reported
            failed += 1
            print(f"{path}: {type(e).__name__}: {e}", file=sys.stderr)
    world.tally.dump(force=True)
    print(f"{h.target.tool}: replayed {len(paths)} inputs, {failed} failed", file=sys.stderr)
    sys.exit(1 if failed else 0)


def command(h: Harness, argv: list[str] | None = None) -> None:
    """The fuzzer's command line (``python -m MODULE --help``): fuzz, replay, regressions,
    coverage."""
    target, work, tool = h.target, h.target.work, h.target.tool
    source_name = Path(target.extension()["sources"][0]).name
    p = argparse.ArgumentParser(prog=f"python -m {h.module}", description=h.doc.split("\n")[0])
    p.add_argument("--runs", type=int, help="inputs to run (libFuzzer -runs); default: until stopped")
    p.add_argument("--max-total-time", type=int, help="seconds (libFuzzer -max_total_time)")
    p.add_argument("--corpus", type=Path, default=work / "corpus")
    p.add_argument("--artifacts", type=Path, default=work / "artifacts")
    p.add_argument("--seed", type=int, help="libFuzzer -seed")
    p.add_argument("--max-len", type=int, default=8192)
    p.add_argument("--value-profile", action="store_true", help="libFuzzer -use_value_profile=1")
    p.add_argument("--json", type=Path, help="write the summary here too")
    p.add_argument("--trace", action="store_true", help="with --replay: print every operation")
    p.add_argument("--source", type=Path, help=f"fuzz this copy of {source_name} instead")
    p.add_argument("--pymalloc", action="store_true",
                   help="keep pymalloc: ~1.8x the inputs/s, but ASan no longer sees small Python "
                        "buffers (replay the corpus without it afterwards)")
    p.add_argument("--replay", nargs="+", metavar="PATH", help="run these inputs (files or dirs) once")
    p.add_argument("--regressions", action="store_true",
                   help="run the inputs that once broke an invariant")
    p.add_argument("--coverage", nargs="?", const=str(work / "corpus"), metavar="DIR",
                   help="gcov line/branch coverage of the C over the inputs in DIR")
    p.add_argument("--child", choices=("fuzz", "replay"), help=argparse.SUPPRESS)
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child == "fuzz":
        return child_fuzz(h, args.rest)
    if args.child == "replay":
        return child_replay(h, args.rest)

    if args.source:
        os.environ[target.source_env] = str(args.source.resolve())
    work.mkdir(parents=True, exist_ok=True)
    stats = work / f"stats-{os.getpid()}.json"
    if args.coverage:
        so = target.build("coverage")
        inputs = files([args.coverage])
        started = time.monotonic()
        rc = subprocess.run([sys.executable, "-m", h.module, "--child", "replay",
                             "--", *inputs], cwd=REPO, env=child_env(so, stats, sanitizers=False)).returncode
        stats.unlink(missing_ok=True)
        source = target.source()
        gcov = subprocess.run(["gcov", "-b", "-c", "-o", str(so.parent),
                               *map(str, target.sources())],
                              cwd=so.parent, capture_output=True, text=True)
        lines = [l for l in gcov.stdout.splitlines() if l.startswith(("File", "Lines", "Branches",
                                                                       "Taken", "Calls"))]
        print("\n".join(lines[:5]))
        print(f"{tool}: {len(inputs)} inputs in {time.monotonic() - started:.1f} s; "
              f"annotated source: {so.parent / (source.name + '.gcov')}")
        sys.exit(rc)

    so = target.build("fuzz")
    if args.regressions:
        folder = Path(tempfile.mkdtemp(prefix="voiceedge-fuzz-regressions-"))
        for name, data in h.regressions().items():
            (folder / name).write_bytes(data)
        args.replay = [str(folder)]
    if args.replay:
        cmd = ["--child", "replay", "--", *files(args.replay)]
        env = child_env(so, stats) | ({"VOICEEDGE_FUZZ_TRACE": "1"} if args.trace else {})
        rc = subprocess.run([sys.executable, "-m", h.module, *cmd], cwd=REPO,
                            env=env).returncode
        stats.unlink(missing_ok=True)
        sys.exit(rc)

    args.corpus.mkdir(parents=True, exist_ok=True)
    args.artifacts.mkdir(parents=True, exist_ok=True)
    if not any(args.corpus.iterdir()):
        for data in h.seeds():
            (args.corpus / ("seed-" + hashlib.sha1(data).hexdigest())).write_bytes(data)
    flags = [str(args.corpus), f"-artifact_prefix={args.artifacts}/", f"-max_len={args.max_len}",
             "-timeout=30", "-rss_limit_mb=8192", "-print_final_stats=1", "-reload=0"]
    flags += [f"-runs={args.runs}"] if args.runs is not None else []
    flags += [f"-max_total_time={args.max_total_time}"] if args.max_total_time else []
    flags += [f"-seed={args.seed}"] if args.seed is not None else []
    flags += ["-use_value_profile=1"] if args.value_profile else []
    before = set(args.artifacts.glob("*"))
    started = time.monotonic()
    log: list[str] = []
    child = subprocess.Popen([sys.executable, "-m", h.module, "--child", "fuzz",
                              "--", *flags], cwd=REPO, env=child_env(so, stats, pymalloc=args.pymalloc),
                             stderr=subprocess.PIPE, text=True, errors="replace")
    for line in child.stderr:
        log.append(line)
        sys.stderr.write(line)
    rc = child.wait()
    out = summary(log, stats, time.monotonic() - started, rc, args.artifacts, before)
    out.update(source=str(target.source()), sources=[str(s) for s in target.sources()],
               source_sha256=target.sources_sha256())
    (work / "last.log").write_text("".join(log))
    stats.unlink(missing_ok=True)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    sys.exit(rc)

