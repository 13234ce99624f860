def whisper(text):
    """Return text in lower case."""
    raise NotImplementedError
