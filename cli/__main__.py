"""`python -m tracefleet.cli`: the same as the `tracefleet` command."""

from tracefleet.cli import main

raise SystemExit(main())
