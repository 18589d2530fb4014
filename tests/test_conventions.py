"""The conventions written once in common/: the kappa parser and label, the writability check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from common.errors import UsageError
from common.io import unwritable
from common.kappa import kappa_label, parse_kappas

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- kappa
@pytest.mark.parametrize("k, label", [
    (1 / 64, "1/64"), (0.015625, "1/64"), (1 / 8, "1/8"), (0.375, "3/8"), (1 / 1024, "1/1024"),
    (0.5, "0.5"), (0.25, "0.25"), (1.5, "1.5"), (0.1, "0.1"), (1.0, "1"), (8.0, "8"), (0.0, "0"),
    (1 / 2048, "0.00048828125"), (1 / 3, "0.3333333333333333"), (1e-7, "1e-07"), (0.3, None),
    (2 / 3, None), (5 / 1024, None), (1.25, None), (123.456, None), (4.0, None)])
def test_kappa_label_is_lossless(k: float, label: str | None) -> None:
    """The label reads back to the same float, so two thresholds never share one (the adversary
    of a label that rounds: limit_denominator or '%g' would give 1/3 and 0.333333 one label)."""
    assert label is None or kappa_label(k) == label
    assert parse_kappas(kappa_label(k)) == [k]
    nxt = k + abs(k) * 2 ** -52  # the next float or so
    assert nxt == k or kappa_label(nxt) != kappa_label(k)


def test_parse_kappas_spellings_order_and_the_one_rule_of_sweep_and_synthetic() -> None:
    from experiments.synthetic import parse_kappas as synthetic_kappas
    from sweeps.grid import parse_kappas as sweep_kappas

    assert parse_kappas("1/64 1/8 1 8") == [1 / 64, 0.125, 1.0, 8.0]
    assert parse_kappas("0.015625,2, 4") == [1 / 64, 2.0, 4.0]  # 0.015625 is 1/64
    assert parse_kappas(" 2  0.5 ") == [2.0, 0.5]  # the given order, not sorted
    assert parse_kappas([0.5, "1/4", 2]) == [0.5, 0.25, 2.0]
    assert parse_kappas("") == [] and parse_kappas(" , ") == []
    assert parse_kappas("1e-3") == [0.001] and parse_kappas("3/8") == [float(Fraction(3, 8))]
    assert sweep_kappas("1/64 1/8") == list(synthetic_kappas("1/64,1/8")) == [1 / 64, 0.125]
    with pytest.raises(UsageError, match="KAPPA: 1/64 given twice"):
        sweep_kappas("1/64 0.015625")
    with pytest.raises(UsageError, match="--kappa: 1/64 given twice"):
        synthetic_kappas("1/64 0.015625")
    for bad in ("1/0", "abc", "-1/64", "nan", "1e999"):  # not a number of bits, < 0, not finite
        with pytest.raises(UsageError, match="^KAPPA: '"):
            parse_kappas(bad, "KAPPA")


# ---------------------------------------------------------------- writability
def test_writable_places_pass_a_file_or_directory_in_the_way_is_named_nothing_is_left(
        tmp_path: Path) -> None:
    assert unwritable(tmp_path) is None
    assert unwritable(tmp_path / "a" / "b" / "c") is None  # can be made
    assert unwritable(tmp_path / "new.json", file=True) is None
    (tmp_path / "old.json").write_text("{}")
    assert unwritable(tmp_path / "old.json", file=True) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # no probe, no dirs
    assert (tmp_path / "old.json").read_text() == "{}"
    (tmp_path / "afile").write_text("x")
    bad = unwritable(tmp_path / "afile" / "runs")
    assert bad is not None and bad.blocker == tmp_path / "afile" and bad.reason == "is a file"
    assert str(bad) == str(unwritable(tmp_path / "afile")) == f"{tmp_path / 'afile'} is a file"
    (tmp_path / "adir").mkdir()
    assert str(unwritable(tmp_path / "adir", file=True)) == f"{tmp_path / 'adir'} is a directory"


def test_chmod_read_only_directory_matches_what_a_write_does(tmp_path: Path) -> None:
    """chmod 0555: unwritable for a user; root really can write there, and the check says so."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        try:  # the ground truth the check must match: what creating a file does
            (d / ".probe-truth").touch()
            (d / ".probe-truth").unlink()
            truth = True
        except OSError:
            truth = False
        assert (unwritable(d) is None) == truth
        assert (unwritable(d / "sub") is None) == truth
        assert truth == (os.geteuid() == 0)
    finally:
        d.chmod(0o755)


_IN_NS = """
import os, sys
from pathlib import Path
from common.io import unwritable
d = Path(sys.argv[1])
bad = unwritable(d)
try:
    (d / "x").touch()
    wrote = True
except OSError:
    wrote = False
print(f"{bad}|{wrote}|{os.access(d, os.W_OK)}|{unwritable(d / 'runs' / 'r1')}")
"""


def test_read_only_bind_mount_is_unwritable_even_for_root(tmp_path: Path) -> None:
    """chmod 0555 plus a read-only bind mount of the directory onto itself, in a private mount
    namespace (unshare), so root too is refused: the check must say so, naming the directory."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare and mount (util-linux)")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && exec "$2" -c "$3" "$1"'
    try:
        r = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", str(d), sys.executable,
                            _IN_NS],
                           capture_output=True, text=True, cwd=ROOT, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        d.chmod(0o755)
    if r.returncode != 0 and ("mount" in r.stderr or "unshare" in r.stderr):
        pytest.skip(f"no private mount namespace here: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, r.stderr
    bad, wrote, _, sub = r.stdout.strip().split("|")
    assert wrote == "False"  # the ground truth: nothing can be created there
    assert bad == f"{d} is not writable (Read-only file system)"
    assert sub == f"{d} is not writable (Read-only file system)"
