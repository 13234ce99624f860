"""A mistake at the command line: what a component raises, and the exit status it ends in.

Its own module on the libraries' floor (not in `tracefleet.cli`, the top): every component raises it, and no
component may import the command line above it.
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
