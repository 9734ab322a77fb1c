"""The project's modules import each other without cycles: read from the source (imports inside
functions too, since a deferred import only hides a cycle; ``if TYPE_CHECKING:`` blocks aside,
they never run). The analysis's own floor is guarded in tests/test_analysis.py."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("analysis", "bench", "scenarios", "services", "topology", "voiceedge")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under an ``if TYPE_CHECKING:``."""
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden |= {id(n) for part in node.body for n in ast.walk(part)}
    return hidden


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project's modules ``path`` imports (``from a import b`` names a.b when it is one)."""
    tree = ast.parse(path.read_text())
    hidden = _type_checking_only(tree)
    out = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in modules:
                out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names
                    if f"{node.module}.{a.name}" in modules}
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), or of one that
    imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(_cycles(graph)) == [["a", "b", "c"], ["e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_imports_are_read_inside_functions_and_not_under_type_checking(tmp_path):
    modules = {"topology.x": tmp_path, "topology.y": tmp_path, "topology.z": tmp_path}
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from topology.y import Y\n"
                    "def f():\n    from topology import x\n    import topology.z\n")
    assert _imports(path, modules) == {"topology.x", "topology.z"}


def test_no_module_of_the_project_imports_itself_through_others():
    modules = _modules()
    assert "topology.impairment.backend" in modules and "analysis.pcap.hops" in modules
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert not _cycles(graph)
