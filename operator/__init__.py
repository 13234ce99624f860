"""tracefleet.operator."""
