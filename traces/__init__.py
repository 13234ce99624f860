"""tracefleet.traces."""
