"""Messages meant for one line of a terminal or a table cell."""

from __future__ import annotations


def one_line(msg: object) -> str:
    """Every run of whitespace (newlines included) as one space, trimmed: an exception's text
    as the one line that bad input gets."""
    return " ".join(str(msg).split())
