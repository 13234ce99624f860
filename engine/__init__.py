"""tracefleet.engine."""
