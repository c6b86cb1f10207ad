"""Descriptive statistics for sequences of numbers."""


def mean(values):
    """Arithmetic mean of a non-empty sequence of numbers."""
    if not values:
        raise ValueError("mean of empty data")
    return sum(values) / len(values)


def median(values):
    """Middle value of a non-empty sequence of numbers.

    For an even number of values the median is the mean of the two middle ones.
    """
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
