from statkit import mean, median


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_median_of_an_odd_number_of_values():
    assert median([3, 1, 2]) == 2
