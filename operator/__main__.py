"""`python -m tracefleet.operator`: the same as `tracefleet operator` (the chart image's entrypoint)."""

import argparse
import sys

from tracefleet.operator.cli import configure, main

parser = argparse.ArgumentParser(prog="python -m tracefleet.operator")
configure(parser)
sys.exit(main(parser.parse_args()))
