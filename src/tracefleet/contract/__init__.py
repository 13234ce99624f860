"""The contract floor: every message that crosses a process, as a typed model.

A module here imports only the standard library, pydantic and other modules of this package: nothing of
the project above it (proxy, runner, operator, traces, engine, diagnostics' implementations). Each process
reads and writes the messages it exchanges through these models and nothing else; a test checks the rule
(tests/foundation/test_import_graph.py).
"""
