def total_items(counts):
    """Return the total number of items in a dict of name -> count."""
    total = 0
    for name in counts:
        total += 1
    return total


def names(counts):
    """Return the item names, sorted."""
    return sorted(counts)
