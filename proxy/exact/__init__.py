"""Exact token-in mode (issue 4): render, splice served ids, generate from token ids, parse."""
