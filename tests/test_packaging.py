"""A non-editable install works: the wheel carries the data files and the C fast path, and the
installed copy runs from another directory, with the repository nowhere on ``sys.path``.

The source tree is copied first (the files a fresh checkout has, plus new files not committed
yet), so the build never writes ``build/`` or ``*.egg-info`` into the working tree and a stale
``build/lib`` cannot bring in a file that the package-data configuration would miss. The wheel
is built offline with this venv's setuptools (``--no-build-isolation``; the ``test`` extra pins
the same floor as ``[build-system]``) and installed with pip into a fresh venv made like the
Makefile's. The run-time dependencies (aiortc, numpy, ...) come from this venv's site-packages,
appended after the fresh venv's own by a ``.pth`` file: ``.pth`` files found there are not
processed, so this venv's editable-install hook stays inactive, and the tests check that every
top-level package imports from the fresh install.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PY_SYSTEM = "/usr/bin/python3"  # as the Makefile's PY_SYSTEM
PACKAGES = ("voiceedge", "services", "topology", "scenarios", "analysis", "bench")
# Read at run time; named here so a change to the scan below cannot make the test vacuous.
REQUIRED_DATA = ("scenarios/default.yaml", "scenarios/ci.yaml", "analysis/budgets.yaml",
                 "topology/regions.yaml", "topology/data/backbone_p95_rtt_ms.csv")
# Data the installed package could read at run time (editor backups and swap files of a shared
# working tree have other suffixes).
DATA_SUFFIXES = {".yaml", ".yml", ".csv", ".json", ".toml", ".txt", ".html", ".css", ".js",
                 ".wav", ".opus", ".pem"}
# Mirrors .gitignore, for a tree that is not a git checkout.
IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache",
                                ".hypothesis", "build", "results", "*.so", "dist")

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict | None = None, timeout: float = 120,
         ) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                    f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


def _copy_source(dest: Path) -> None:
    """The files of a fresh checkout plus untracked, not ignored ones (or everything not
    ignored, when the tree is not a git checkout)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=REPO, capture_output=True,
                                timeout=30, check=True).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        shutil.copytree(REPO, dest, ignore=IGNORE)
        return
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():  # a tracked file may be deleted in the working tree
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _data_files(tree: Path) -> set[str]:
    """Every data file inside the packages' folders: what the wheel must carry."""
    return {p.relative_to(tree).as_posix()
            for package in PACKAGES for p in (tree / package).rglob("*")
            if p.is_file() and p.suffix in DATA_SUFFIXES and "__pycache__" not in p.parts}


class Install:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.source = root / "src"
        self.wheel: Path | None = None
        self.venv = root / "venv"
        self.python = self.venv / "bin" / "python"
        self.elsewhere = root / "elsewhere"  # the working directory of every run
        self.site: Path | None = None

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PYTHON") and k not in ("VIRTUAL_ENV", "PWD")}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env

    def python_json(self, code: str) -> dict:
        """Run ``code`` in the fresh venv, isolated (-I: no cwd, no PYTHON* variables, no
        user site), from ``elsewhere``; it prints one JSON object."""
        proc = _run([str(self.python), "-I", "-c", textwrap.dedent(code)], self.elsewhere,
                    self.env(), timeout=60)
        return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def install(tmp_path_factory) -> Install:
    try:
        have = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        have = "none"
    if tuple(int(x) for x in re.findall(r"\d+", have)[:2]) < (74, 1):
        pytest.fail(f"setuptools {have} in {sys.prefix} cannot build the C extension from "
                    "pyproject.toml (needs >= 74.1, the test extra): run `make venv`")
    inst = Install(tmp_path_factory.mktemp("packaging"))
    inst.source.mkdir()
    inst.elsewhere.mkdir()
    _copy_source(inst.source)

    dist = inst.root / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--no-index", "--disable-pip-version-check", "-q", "-w", str(dist), "."], inst.source)
    [inst.wheel] = dist.glob("voiceedge-*.whl")

    _run([PY_SYSTEM, "-m", "venv", "--system-site-packages", str(inst.venv)], inst.root)
    _run([str(inst.python), "-m", "pip", "install", "--no-deps", "--no-index",
          "--disable-pip-version-check", "-q", str(inst.wheel)], inst.elsewhere, inst.env())
    site = _run([str(inst.python), "-I", "-c", "import sysconfig; "
                 "print(sysconfig.get_paths()['purelib'])"], inst.elsewhere, inst.env())
    inst.site = Path(site.stdout.strip())
    # The dependencies: this venv's site-packages, after the fresh venv's own.
    deps = sysconfig.get_paths()["purelib"]
    (inst.site / "zz-voiceedge-test-deps.pth").write_text(deps + "\n")
    return inst


def test_wheel_carries_every_data_file_and_the_fast_path(install):
    names = set(zipfile.ZipFile(install.wheel).namelist())
    expected = _data_files(install.source)
    assert set(REQUIRED_DATA) <= expected, "the source tree lacks a file the code reads"
    assert sorted(expected - names) == [], "data files of the source tree missing in the wheel"
    with open(REPO / "pyproject.toml", "rb") as f:
        extensions = [e["name"] for e in tomllib.load(f)["tool"]["setuptools"]["ext-modules"]]
    assert "services.relay._fastpath" in extensions and "topology.impairment._engine" in extensions
    for ext in extensions:
        stem = ext.replace(".", "/") + "."
        assert [n for n in names if n.startswith(stem) and n.endswith(".so")], \
            f"the wheel has no compiled {ext}"
    assert "bench/srtp_floor.c" in names, "voiceedge bench srtp builds it at run time"


def test_installed_copy_is_what_imports(install):
    files = install.python_json("""
        import importlib, json, sys
        names = ["voiceedge", "services", "topology", "scenarios", "analysis", "bench",
                 "services.relay._fastpath"]
        print(json.dumps({n: importlib.import_module(n).__file__ for n in names}))
    """)
    for name, file in files.items():
        assert Path(file).is_relative_to(install.site), f"{name} imported from {file}"
        assert not Path(file).is_relative_to(REPO), f"{name} imported from the repository"
    assert files["services.relay._fastpath"].endswith(".so")


def test_command_line_runs(install):
    env = install.env()
    out = _run([str(install.python), "-I", "-m", "voiceedge", "--help"], install.elsewhere, env,
               timeout=60).stdout
    assert "scenario" in out and "budgets" in out
    script = install.venv / "bin" / "voiceedge"
    out = _run([str(script), "scenario", "--help"], install.elsewhere, env, timeout=60).stdout
    assert "--region" in out
    out = _run([str(script), "--version"], install.elsewhere, env, timeout=60).stdout
    version = tomllib.loads((install.source / "pyproject.toml").read_text())["project"]["version"]
    assert out.strip() == f"voiceedge {version}"


def test_shipped_data_loads_from_another_directory(install):
    got = install.python_json("""
        import json
        from pathlib import Path
        from analysis.budgets import BUDGETS_FILE, BudgetFile
        from scenarios.spec import DEFAULT_SCENARIO, Scenario
        from topology.regions import RegionsCatalog
        import scenarios, topology
        default = Scenario.load(DEFAULT_SCENARIO)
        ci = Scenario.load(Path(scenarios.__file__).with_name("ci.yaml"))
        budgets = BudgetFile.load()
        catalog = RegionsCatalog.load()
        csv = Path(topology.__file__).with_name("data") / "backbone_p95_rtt_ms.csv"
        print(json.dumps({
            "default": [str(DEFAULT_SCENARIO), default.name, list(default.clusters)],
            "ci": [ci.name, list(ci.clusters)],
            "budgets": [str(BUDGETS_FILE), len(budgets.budgets), budgets.region],
            "regions": len(catalog.regions), "backbone": len(catalog.backbone),
            "csv_lines": len(csv.read_text().splitlines()),
        }))
    """)
    assert Path(got["default"][0]).is_relative_to(install.site)
    assert got["default"][1] and got["default"][2]
    assert got["ci"][0] and got["ci"][1]
    assert Path(got["budgets"][0]).is_relative_to(install.site)
    assert got["budgets"][1] > 0 and got["budgets"][2]
    assert got["regions"] > 0 and got["backbone"] > 0
    assert got["csv_lines"] > 1


def test_budget_scenario_resolves_from_another_directory(install):
    """`voiceedge budgets` runs the budgets file's scenario (`scenario: scenarios/ci.yaml`):
    the path it gets must name the shipped file wherever the command runs."""
    got = install.python_json("""
        import json
        from pathlib import Path
        from analysis.budgets import BudgetFile
        from scenarios.spec import Scenario
        path = BudgetFile.load().scenario_path()
        print(json.dumps({"path": str(path), "exists": path.is_file(),
                          "name": Scenario.load(path).name if path.is_file() else None}))
    """)
    assert got["exists"], (f"BudgetFile.load().scenario_path() = {got['path']!r} does not exist "
                           f"from {install.elsewhere}")
    assert Path(got["path"]).resolve().is_relative_to(install.site)
    assert got["name"]
