from spans import merge


def test_overlapping_pair():
    assert merge([(1, 4), (2, 6)]) == [(1, 6)]


def test_nothing_to_merge():
    assert merge([]) == []
