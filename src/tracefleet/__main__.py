from tracefleet.cli import main

raise SystemExit(main())
