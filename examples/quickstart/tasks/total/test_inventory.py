from inventory import total_items


def test_total_items():
    assert total_items({"a": 2, "b": 3}) == 5
