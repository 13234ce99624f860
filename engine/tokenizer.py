"""Moved to `tracefleet.formats.tokenizer` (shared by the engine and the proxy's exact mode)."""

from tracefleet.formats.tokenizer import HFTokenizer, IncrementalDetokenizer, Tokenizer  # noqa: F401
