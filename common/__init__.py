"""Conventions shared by every package, each written once (paths, records, arms, benchmarks,
io, provenance, kappa, text, errors). Depends on nothing but the standard library (PyYAML is
imported only when a run record is read or written)."""
