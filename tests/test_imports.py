"""The direction of dependencies (docs/DESIGN.md, "Layout"): a rule for every top-level package,
no import cycle between modules and none between packages (a package is a directory:
experiments.train and experiments.corpus are two), counting imports inside functions too (a
function-level import hides a cycle from Python, not from the design), and no name private to
another package used."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import networkx as nx
import pytest
from conftest import PACKAGES, nodes, plant, source_files

ROOT = Path(__file__).resolve().parents[1]


def _modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for p in source_files(root):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _from(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, relative levels resolved."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = here[:len(here) - node.level + 1] if node.level else []
    return ".".join(base + ([node.module] if node.module else []))


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules `name` imports anywhere in its body (an attribute imported from a package
    is an edge to the package's __init__)."""
    found: set[str] = set()
    for node in nodes(path):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = _from(name, path, node)
            found.update(f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod
                         for a in node.names)
    return {m for m in found if m in known and m != name}


@functools.cache
def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports (built once per tree; callers only read it)."""
    mods = _modules(root)
    return {n: _imports(n, p, set(mods)) for n, p in mods.items()}


def find_cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module."""
    dg = nx.DiGraph([(a, b) for a, targets in g.items() for b in targets])
    comps = sorted(sorted(c) for c in nx.strongly_connected_components(dg) if len(c) > 1)
    cycles = [nx.find_cycle(dg.subgraph(c), c[0]) for c in comps]
    return [[a for a, _ in cyc] + [cyc[0][0]] for cyc in cycles]


def _package(module: str, path: Path) -> str:
    """The package a module belongs to (its directory): 'experiments.train' for
    experiments.train.trainer, 'model' for model.free_transformer and for model/__init__."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0] or module


def package_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Package -> the other packages its modules import (anywhere in their bodies)."""
    pkg = {n: _package(n, p) for n, p in _modules(root).items()}
    out: dict[str, set[str]] = {}
    for name, targets in graph(root).items():
        out.setdefault(pkg[name], set()).update(pkg[t] for t in targets if pkg[t] != pkg[name])
    return out


@pytest.mark.parametrize("kind", ["module", "package"])
def test_no_import_cycle(kind: str) -> None:
    cycles = find_cycles(graph() if kind == "module" else package_graph())
    assert not cycles, f"{kind} cycles: " + "; ".join(" -> ".join(c) for c in cycles)


# ---------------------------------------------------------------- the direction of dependencies
ALLOWED = {  # top-level package -> the project packages it may import (docs/DESIGN.md)
    "common": {"common"},
    "model": {"model", "common"},
    "experiments": {"experiments", "model", "common"},
    "sweeps": {"sweeps", "experiments", "model", "common"},
    "pipelines": {"pipelines", "sweeps", "experiments", "model", "analysis", "common"},
    "analysis": {"analysis", "common"},
}
"""Every arrow points down the floors: pipelines (what drives the others) -> sweeps (grids,
launchers) -> experiments (entry points and their parts) -> model -> common; analysis reads
result files only (common and itself)."""


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _definitions(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Private name -> the packages defining it (a def or class, a module-level assignment or a
    `self._x = ...` attribute)."""
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        for node in nodes(path):
            found: list[str] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.append(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Name):
                        found.append(t.id)
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                            and t.value.id == "self":
                        found.append(t.attr)
            for n in filter(_private, found):
                out.setdefault(n, set()).add(_package(name, path))
    return out


def direction_violations(root: Path = ROOT) -> list[str]:
    """Every import that points against docs/DESIGN.md's arrows, and every private name used
    outside the package that defines it: `from pkg.mod import _x`, or `<anything>._x` where
    only other packages define `_x`. Function-level code counts too. One line per site."""
    mods = _modules(root)
    defs = _definitions(mods)
    bad: list[str] = []
    for name, path in mods.items():
        top, pkg, rel = name.split(".")[0], _package(name, path), path.relative_to(root)
        for target in sorted(_imports(name, path, set(mods))):
            if target.split(".")[0] not in ALLOWED[top]:
                bad.append(f"{rel}: imports {target} ({top} may import only "
                           f"{', '.join(sorted(ALLOWED[top]))} and third-party)")
        for node in nodes(path):
            if isinstance(node, ast.ImportFrom):
                mod = _from(name, path, node)
                if mod.split(".")[0] not in PACKAGES:
                    continue
                owner = mod if (root / Path(*mod.split("."))).is_dir() else \
                    mod.rpartition(".")[0] or mod
                bad += [f"{rel}:{node.lineno}: imports {mod}.{a.name}, private to {owner}"
                        for a in node.names if _private(a.name) and owner != pkg]
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                owners = defs.get(node.attr, set())
                if owners and pkg not in owners:
                    bad.append(f"{rel}:{node.lineno}: uses .{node.attr}, private to "
                               f"{', '.join(sorted(owners))}")
    return bad


def test_the_checkers_catch_each_kind(tmp_path: Path) -> None:
    """The adversary: a planted tree with one violation of each kind, then with two more.
    experiments.corpus -> experiments.train -> experiments.corpus is a package cycle though no
    two modules import each other (one import is relative, inside a function)."""
    root = plant(tmp_path, {
        "common/__init__.py": "", "common/paths.py": "import os\n",
        "model/__init__.py": "", "model/core.py": "class _Ctx: ...\ndef _rope(): ...\n",
        "experiments/__init__.py": "",
        "experiments/eval/__init__.py": "",
        "experiments/eval/bound.py": "from model.core import _Ctx\n"
                                     "def f(m):\n    return m._rope()\n",
        "experiments/train/__init__.py": "",
        "experiments/train/trainer.py": "def _param_groups(): ...\n",
        "experiments/train/data.py": "from experiments.corpus import build\n",
        "experiments/corpus/__init__.py": "",
        "experiments/corpus/build.py": "def f():\n    from ..train import trainer\n",
        "experiments/bench/__init__.py": "",
        "experiments/bench/probes.py": "from experiments.train.trainer import _param_groups\n",
        "sweeps/__init__.py": "",
        "analysis/__init__.py": "",
        "analysis/table.py": "import pandas\ndef g():\n    from experiments.eval import bound\n",
    })
    found = "\n".join(direction_violations(root))
    assert "analysis/table.py: imports experiments.eval.bound" in found
    assert "experiments/eval/bound.py:1: imports model.core._Ctx, private to model" in found
    assert "experiments/eval/bound.py:3: uses ._rope, private to model" in found
    assert "experiments/bench/probes.py:1: imports experiments.train.trainer._param_groups" \
        in found
    assert len(found.splitlines()) == 4, found
    assert find_cycles(package_graph(root)) == [["experiments.corpus", "experiments.train",
                                                 "experiments.corpus"]]
    assert find_cycles(graph(root)) == []  # and no module cycle
    (root / "common/paths.py").write_text("from model import core\n")
    (root / "model/core.py").write_text("from experiments.eval import bound\n")
    found = "\n".join(direction_violations(root))
    assert "common/paths.py: imports model.core (common may import only common" in found
    assert "model/core.py: imports experiments.eval.bound (model may import only common, model" \
        in found


def test_dependencies_point_one_way() -> None:
    assert set(ALLOWED) == set(PACKAGES)  # every package has a rule
    bad = direction_violations()
    assert not bad, "against the design's arrows:\n" + "\n".join(bad)


def test_no_package_imports_the_notebook() -> None:
    """dev/ (one-off measurements, generators of finished studies) imports the packages, never
    the reverse."""
    bad = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in _modules().values() for n in nodes(p)
           if (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "dev" for a in n.names))
           or (isinstance(n, ast.ImportFrom) and not n.level
               and (n.module or "").split(".")[0] == "dev")]
    assert not bad, bad
