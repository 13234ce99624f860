from words import longest_length


def test_longest_length():
    assert longest_length(["a", "abc", "ab"]) == 3
