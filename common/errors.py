"""The one usage-error path of every entry point.

`UsageError` is bad input from the user (a value, a file, a combination of options): its message
is the one line the user reads. Every `python -m ...` entry point runs its body through `cli`,
which prints `<prog>: error: <message>` on stderr and returns 2 for a UsageError (nothing is
written before the input is checked), and turns Ctrl-C into one line that says how to resume
instead of a traceback (exit 130). Other exceptions are bugs and keep their traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from common.text import one_line


class UsageError(ValueError):
    """Bad input; the message is one line meant for the user (exit 2)."""


class ArgParser(argparse.ArgumentParser):
    """argparse whose errors are UsageErrors: `cli` prints them as the one line (argparse's own
    prints the usage before its error line)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (argparse names the flag in the error line)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be >= 1")
    return v


RESUME_HINT = "re-run the same command to resume"


def cli(prog: str, body: Callable[[], int], interrupted: str = RESUME_HINT) -> int:
    """Run an entry point's body: its return code; 2 with one line for a UsageError; 130 with
    one line (`interrupted`, e.g. how to resume) for Ctrl-C."""
    try:
        return body()
    except UsageError as e:
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; {interrupted}", file=sys.stderr)
        return 130
