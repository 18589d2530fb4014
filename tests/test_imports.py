"""No import cycle among the project's packages, counting imports inside functions too (a
function-level import hides a cycle from Python, not from the design)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "model", "experiments", "sweeps", "analysis")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules `name` imports anywhere in its body (an attribute imported from a package
    is an edge to the package's __init__)."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{mod}.{a.name}"
                found.add(sub if sub in known else mod)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {n: _imports(n, p, set(mods)) for n, p in mods.items()}


def find_cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return [_cycle_in(g, set(c)) for c in comps]


def _cycle_in(g: dict[str, set[str]], comp: set[str]) -> list[str]:
    start = min(comp)
    path, seen = [start], {start}
    while True:  # walk inside the component until a module repeats
        nxt = min(w for w in g[path[-1]] if w in comp)
        if nxt in seen:
            return path[path.index(nxt):] + [nxt]
        path.append(nxt)
        seen.add(nxt)


def test_the_walker_sees_function_level_cycles() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(g) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    src = graph()
    assert "model.build" in src["model.checkpoint"]  # a relative from-import resolves
    assert "experiments.eval.run" in src["sweeps.backend"]  # so does one inside a function


def test_no_import_cycle() -> None:
    cycles = find_cycles(graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
