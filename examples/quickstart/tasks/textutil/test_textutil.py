from textutil import shout, word_count


def test_shout():
    assert shout("hello") == "HELLO!"


def test_word_count():
    assert word_count("a b  c") == 3
