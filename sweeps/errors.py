"""The old name of common.errors.UsageError, while pipelines/corpus.py imports it from here."""

from common.errors import UsageError as SweepError  # noqa: F401
