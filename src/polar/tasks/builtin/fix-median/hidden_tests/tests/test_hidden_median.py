import pytest

from statkit import median


def test_even_length_is_the_mean_of_the_two_middle_values():
    assert median([1, 2, 3, 4]) == 2.5


def test_even_length_unsorted_input():
    assert median([10, 2, 8, 4]) == 6


def test_odd_length_unsorted_input():
    assert median([5, 1, 9, 3, 7]) == 5


def test_single_value():
    assert median([42]) == 42


def test_empty_input_raises_value_error():
    with pytest.raises(ValueError):
        median([])


def test_input_is_left_unchanged():
    data = [3, 1, 2, 0]
    median(data)
    assert data == [3, 1, 2, 0]
