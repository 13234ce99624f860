"""The engine's chat templates moved to `tracefleet.formats.templates` (shared with the proxy)."""
