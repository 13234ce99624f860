"""A mistake at the command line: what a component raises, and the exit status it ends in.

Its own module (not `tracefleet.cli`) so that `python -m tracefleet.cli`, where the CLI module runs as
`__main__`, still catches the one class every component raises.
"""

from __future__ import annotations

import argparse

from tracefleet.contract import environment

USAGE_EXIT = 2  # a mistake in how the command was called (argparse's own status for bad flags)
DEBUG_ENV = environment.DEBUG


class UsageError(Exception):
    """A mistake the user can fix (bad path, bad value): printed as one line, exit status USAGE_EXIT."""


def positive_int(text: str) -> int:
    """argparse type for counts (sessions, threads): `-j 0` is a mistake, not "use the default"."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
