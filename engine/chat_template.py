"""Moved to `tracefleet.formats.chat_template` (shared by the engine and the proxy's exact mode)."""

from tracefleet.formats.chat_template import (TemplateError, compiled, content_text, normalize_messages,  # noqa: F401
                                              render_chat)
