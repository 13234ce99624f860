from inventory import names, total_items


def test_total_items():
    assert total_items({"apple": 3, "pear": 2}) == 5


def test_names():
    assert names({"b": 1, "a": 2}) == ["a", "b"]
