"""tracefleet.proxy."""
