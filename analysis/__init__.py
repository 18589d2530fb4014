"""Results -> tidy pandas frame -> tables, figures, claims checklist, HTML report.

Reads only files under the results root ($FTBENCH_RESULTS, default results/), as docs/RESULTS.md
lists them. Modules: `frame` (load_sweep: the tidy frame), `stats` (intervals, paired
bootstrap), `tables` (paper-style tables, CSV/Markdown/LaTeX), `figures`, `claims`, `report`
(`python -m analysis.report --name <sweep>`), `browser` (headless Chromium check), `fake`
(fabricated result files for tests), `synthetic` (the synthetic task's table and figure).
"""
