"""tracefleet: reinforcement learning for LLM agents through their real harness."""

__version__ = "0.1.0"
