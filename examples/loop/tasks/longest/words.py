def longest_length(words):
    """Return the length of the longest string in the list words."""
    raise NotImplementedError
