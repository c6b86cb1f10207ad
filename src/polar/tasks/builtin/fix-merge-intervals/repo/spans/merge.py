"""Merging of closed intervals."""


def merge(intervals):
    """Merge overlapping intervals.

    ``intervals`` is an iterable of ``(start, end)`` pairs with ``start <= end``,
    each the closed range ``[start, end]``. The result is a list of disjoint
    ``(start, end)`` tuples sorted by start.
    """
    merged = []
    for start, end in intervals:
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [tuple(pair) for pair in merged]
