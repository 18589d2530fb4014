"""Results -> tidy pandas frame -> tables, figures, claims checklist, HTML report.

Reads only files under the results root (common.paths.results_root: $FTBENCH_RESULTS, default
results/), as docs/RESULTS.md lists them. Modules, each importing only those before it:
`stats` (intervals, paired bootstrap), `frame` (load_sweep: the tidy frame), `tables`
(paper-style tables, CSV/Markdown/LaTeX), `derived` (collapse and overhead tables), `claims`,
`figures`, `browser` (headless Chromium check), `report`
(`python -m analysis.report --name <sweep>`), `synthetic` (the synthetic task's table and
figure), `calibrate` (`make calibrate`: planted-truth sweeps through the real analysis).
Fabricated result files for tests live in tests/fake.py.
"""
