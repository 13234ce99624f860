def shout(text):
    """Return text in upper case."""
    raise NotImplementedError
