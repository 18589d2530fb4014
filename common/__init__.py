"""Conventions shared by every package, each written once: where results live (`paths`), how
files are written and locked (`io`), and what a result file records about its origin
(`provenance`). Depends on nothing but the standard library."""
