"""tracefleet: reinforcement learning for LLM agents through their real harness."""

from pathlib import Path as _Path

__version__ = "0.1.0"

# `operator/` is a namespace folder (no __init__.py, see setup.py) so that it can never shadow the stdlib
# `operator` when Python runs from the checkout. Installed wheels find it inside this package; an
# editable install's finder only maps regular packages, so from a checkout the root joins __path__.
_checkout = _Path(__file__).resolve().parents[2]
if (_checkout / "setup.py").is_file() and (_checkout / "operator").is_dir():
    __path__.append(str(_checkout))
