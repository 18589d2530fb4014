"""Result files -> pandas frames -> statistics -> tables -> Markdown and HTML (one renderer:
`render`). `frame` reads sweeps, `stats` holds every interval and test, `tables` the paper-style
comparisons, then `claims`, `lead`, `card`, `figures`, `report` (`python -m analysis.report`);
`synthetic`, `probe`/`latent` and `study` read their own result files through the same path.
The calibration harness is test support (tests/calibration.py); generators of finished studies
live in dev/.
"""
