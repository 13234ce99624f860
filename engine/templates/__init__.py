"""Chat templates shipped with the engine (package data: the .jinja files beside this module)."""
