def subtract(a, b):
    """Return a minus b."""
    raise NotImplementedError
