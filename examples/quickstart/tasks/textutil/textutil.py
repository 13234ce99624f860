def shout(text):
    """Return text in upper case followed by an exclamation mark."""
    return text.lower() + "!"


def word_count(text):
    """Return the number of whitespace-separated words in text."""
    return len(text.split())
