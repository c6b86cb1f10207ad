import pytest

from pager import get_page, page_count

ITEMS = list(range(25))


def test_exact_multiple():
    assert page_count(20, 10) == 2


def test_one_more_than_a_multiple():
    assert page_count(21, 10) == 3


def test_no_items_no_pages():
    assert page_count(0, 10) == 0


def test_a_single_item():
    assert page_count(1, 10) == 1


def test_first_page():
    assert get_page(ITEMS, 1, 10) == list(range(10))


def test_last_partial_page():
    assert get_page(ITEMS, 3, 10) == [20, 21, 22, 23, 24]


def test_past_the_end_is_empty():
    assert get_page(ITEMS, 4, 10) == []


def test_page_zero_is_rejected():
    with pytest.raises(ValueError):
        get_page(ITEMS, 0, 10)
