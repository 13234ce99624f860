"""Model formats shared by the engine and the proxy: chat templates, tokenizers, model families and
their output parsers (reasoning, tool calls). Components depend on this module, not on each other."""
