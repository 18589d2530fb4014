"""The typed records change no number: fixed planted sweeps read back to the frames and report
tables captured before common/records.py existed (tests/records_golden.py).

Compared as CSV text (byte-equal), except:
- `config_sha256`/`file_sha256`, the hashes of the planted files' bytes, which a writer that
  orders keys differently changes without changing any content (dropped on both sides);
- the planted root's path, replaced by <root>;
- `evals` (eval-file headers for the provenance footer) and `likelihood` (the likelihood files'
  fields): these now come from the records' `to_json()`, so their columns are in the records'
  order (compared with sorted columns), every header has the record's fields (`schema`, `arm`,
  `checkpoint`, `checkpoint_step`, `seed`: null where a file lacked them) and a null `z_mode`
  reads as "prior" (what every reader already took it to mean).
"""

from __future__ import annotations

import difflib
import io

import pandas as pd
import pytest
from records_golden import GOLDEN, frames, plant, to_csv

RECORD_COLS = {"schema", "arm", "checkpoint", "checkpoint_step", "seed"}

# a regression guard over three planted sweeps (about 6 s): the CI tier runs it; test_analysis
# keeps frame and tables covered in the fast tier
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    return root, {name: frames(root, name) for name in plant(root)}


def _as_frames(want: str, have: str) -> list[str]:
    """Differences between two CSVs as frames with sorted columns (see the module doc)."""
    w = pd.read_csv(io.StringIO(want)) if want.strip() else pd.DataFrame()
    h = pd.read_csv(io.StringIO(have)) if have.strip() else pd.DataFrame()
    out = []
    for c in sorted(set(h.columns) - set(w.columns)):
        if c not in RECORD_COLS or not (h[c].isna().all() or c == "schema"):
            out.append(f"new column {c} with values")
    missing = set(w.columns) - set(h.columns)
    if missing:
        out.append(f"columns gone: {sorted(missing)}")
    if "z_mode" in w:
        w["z_mode"] = w["z_mode"].fillna("prior")
    cols = sorted(set(w.columns) & set(h.columns))
    try:
        pd.testing.assert_frame_equal(w[cols], h[cols], check_dtype=False)
    except AssertionError as e:
        out.append(str(e))
    return out


@pytest.mark.parametrize("name", ["extras", "spec", "calib"])
def test_frames_and_tables_equal_the_goldens(planted, name):
    root, got = planted
    want_files = sorted(p.stem for p in (GOLDEN / name).glob("*.csv"))
    assert sorted(got[name]) == want_files
    bad = []
    for key in want_files:
        want = (GOLDEN / name / f"{key}.csv").read_text(encoding="utf-8")
        have = to_csv(got[name][key], root)
        if key in ("evals", "likelihood"):
            bad += [f"{name}/{key}.csv: {d}" for d in _as_frames(want, have)]
        elif have != want:
            diff = "".join(list(difflib.unified_diff(want.splitlines(True), have.splitlines(True),
                                                     "golden", "now", n=0))[:12])
            bad.append(f"{name}/{key}.csv differs:\n{diff}")
    assert not bad, "\n".join(bad)
