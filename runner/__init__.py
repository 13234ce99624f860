"""tracefleet.runner."""
