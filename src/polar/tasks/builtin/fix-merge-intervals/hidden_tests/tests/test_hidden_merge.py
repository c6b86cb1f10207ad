from spans import merge


def test_touching_intervals_merge():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]


def test_unsorted_input():
    assert merge([(5, 7), (1, 2), (2, 3)]) == [(1, 3), (5, 7)]


def test_contained_interval():
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]


def test_disjoint_unsorted_intervals_come_out_sorted():
    assert merge([(8, 9), (1, 2)]) == [(1, 2), (8, 9)]


def test_any_iterable():
    assert merge(iter([(4, 6), (1, 5)])) == [(1, 6)]


def test_input_is_left_unchanged():
    data = [(3, 4), (1, 2)]
    merge(data)
    assert data == [(3, 4), (1, 2)]
