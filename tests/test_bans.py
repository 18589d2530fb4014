"""What is spelled in one place only (issue 35): the results layout in common/ (RunDir,
SweepDir), a benchmark's task name in its registry row and its own loader, and an arm's
kind in its Arm record. Each check reads the source as Python (string literals in code, not
docstrings or comments) and is tried first on a planted tree that breaks it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from conftest import nodes, plant, source_files

from common import benchmarks

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ("final.pt", "config.yaml", "metrics.jsonl")
"""File names of a run directory that only common/ (paths.RunDir) may spell."""
MAX_TASK_FILES = 2
"""A task name is a literal in its registry row and in its own loader, nowhere else."""
MAX_ARM_TESTS = 10
"""`"free"` / `is_free` tests allowed outside the Arm record and model/ (issue 35: fewer than 10;
the rest of the tree asks the Arm record)."""


def _literals(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every string literal in code (f-string parts included; a string that
    is a statement of its own, a docstring or an attribute's, is prose, as comments are)."""
    found = nodes(path)
    skip = {id(n.value) for n in found if isinstance(n, ast.Expr)}
    for n in found:
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip:
            yield n.lineno, n.value


def layout_literals(root: Path = ROOT) -> list[str]:
    """'path:line: "text"' for every literal outside common/ that spells a layout file name."""
    out = []
    for p in source_files(root):
        rel = p.relative_to(root)
        if rel.parts[0] == "common":
            continue
        out += [f"{rel}:{line}: {text!r}" for line, text in _literals(p)
                if any(name in text for name in LAYOUT)]
    return out


def task_literal_files(root: Path = ROOT) -> dict[str, list[str]]:
    """Task name -> the source files holding it as a literal (the whole string)."""
    names = {b.task for b in benchmarks.BENCHMARKS if b.task}
    out: dict[str, list[str]] = {t: [] for t in sorted(names)}
    for p in source_files(root):
        found = {text for _, text in _literals(p)} & names
        for t in found:
            out[t].append(str(p.relative_to(root)))
    return out


def arm_tests(root: Path = ROOT) -> list[str]:
    """'path:line' of every test of an arm by name or by `is_free` outside common/arms.py and
    model/: a comparison (==, !=, in, not in) with the literal "free" on either side or in a
    container, `.isin([... "free" ...])`, and any use of the name `is_free`."""
    def is_free_lit(n: ast.AST) -> bool:
        if isinstance(n, ast.Constant):
            return n.value == "free"
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            return any(is_free_lit(e) for e in n.elts)
        return False

    out = []
    for p in source_files(root):
        rel = p.relative_to(root)
        if rel.parts[0] == "model" or rel.as_posix() == "common/arms.py":
            continue
        for n in nodes(p):
            hit = (isinstance(n, ast.Compare) and any(map(is_free_lit, [n.left, *n.comparators]))
                   or isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and n.func.attr == "isin" and any(map(is_free_lit, n.args))
                   or isinstance(n, ast.Attribute) and n.attr == "is_free"
                   or isinstance(n, ast.Name) and n.id == "is_free")
            if hit:
                out.append(f"{rel}:{n.lineno}")
    return sorted(set(out))


def test_the_checks_catch_each_kind(tmp_path: Path) -> None:
    """The adversary: one planted violation of each kind, beside what the checks must pass."""
    root = plant(tmp_path, {
        "common/paths.py": 'FINAL = "final.pt"\n',
        "common/arms.py": 'def f(a):\n    return a == "free"\n',
        "model/config.py": "def g(c):\n    return c.is_free\n",
        "experiments/eval/run.py": (
            '"""Reads config.yaml (prose)."""\n'
            'def f(rd, t):\n    p = rd / "checkpoints" / "final.pt"\n'
            '    q = f"{rd}/metrics.jsonl"\n    return "gsm8k", t.arm == "free"\n'),
        "experiments/eval/lm.py": "def h(m):\n    return m.cfg.is_free or m.arm in ('free',)\n",
        "analysis/t.py": 'X = 1\n"""config.yaml: an attribute docstring."""\n'
                         'def k(df):\n    return df["arm"].isin(["free"]), "gsm8k"\n',
        "sweeps/s.py": 'A = "gsm8k"\nB = "free-k0.5"\n'})
    assert layout_literals(root) == ["experiments/eval/run.py:3: 'final.pt'",
                                     "experiments/eval/run.py:4: '/metrics.jsonl'"]
    files = task_literal_files(root)
    assert sorted(files["gsm8k"]) == ["analysis/t.py", "experiments/eval/run.py",
                                      "sweeps/s.py"]
    assert arm_tests(root) == ["analysis/t.py:4", "experiments/eval/lm.py:2",
                               "experiments/eval/run.py:5"]


def test_no_layout_literal_outside_common() -> None:
    bad = layout_literals()
    assert not bad, ("spelled outside common/ (ask common.paths.RunDir / SweepDir):\n"
                     + "\n".join(bad))


def test_a_task_name_is_spelled_in_its_row_and_its_loader_only() -> None:
    files = task_literal_files()
    over = {t: fs for t, fs in files.items() if len(fs) > MAX_TASK_FILES}
    assert not over, ("task names spelled in more than their registry row "
                      "(common/benchmarks.py) and their loader:\n"
                      + "\n".join(f"{t}: {', '.join(fs)}" for t, fs in over.items()))
    for t, fs in files.items():
        assert "common/benchmarks.py" in fs, f"{t}: no registry row spells it"


def test_arms_are_asked_of_their_record() -> None:
    found = arm_tests()
    assert len(found) < MAX_ARM_TESTS, (
        f"{len(found)} tests of an arm by name or is_free outside common/arms.py and model/ "
        "(ask common.arms):\n" + "\n".join(found))
