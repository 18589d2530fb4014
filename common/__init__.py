"""Conventions shared by every package, each written once: where results live (`paths`), how
files are written and locked and whether a place can be written (`io`), what a result file
records about its origin (`provenance`), how kappa is read and labelled (`kappa`), and the one
line an error message becomes (`text`). Depends on nothing but the standard library."""
