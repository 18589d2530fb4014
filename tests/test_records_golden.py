"""The typed records change no number: fixed planted sweeps read back to the frames and report
tables of tests/data/records_golden/ (tests/records_golden.py), compared as CSV text
(byte-equal), with `config_sha256`/`file_sha256` (hashes of the planted files' bytes, which a
writer that orders keys differently changes without changing any content) dropped and the
planted root's path replaced by <root>. The goldens were captured before common/records.py
existed; `evals.csv` (the eval-file headers) was re-captured once its columns came from the
records (their order, their null fields, a null z_mode read as "prior"), every value equal.
"""

from __future__ import annotations

import difflib

import pytest
from records_golden import GOLDEN, frames, plant, to_csv

# a regression guard over three planted sweeps (about 6 s): the CI tier runs it; test_analysis
# keeps frame and tables covered in the fast tier
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    return root, {name: frames(root, name) for name in plant(root)}


@pytest.mark.parametrize("name", ["extras", "spec", "calib"])
def test_frames_and_tables_equal_the_goldens(planted, name):
    root, got = planted
    want_files = sorted(p.stem for p in (GOLDEN / name).glob("*.csv"))
    assert sorted(got[name]) == want_files
    bad = []
    for key in want_files:
        want = (GOLDEN / name / f"{key}.csv").read_text(encoding="utf-8")
        have = to_csv(got[name][key], root)
        if have != want:
            diff = "".join(list(difflib.unified_diff(want.splitlines(True), have.splitlines(True),
                                                     "golden", "now", n=0))[:12])
            bad.append(f"{name}/{key}.csv differs:\n{diff}")
    assert not bad, "\n".join(bad)
