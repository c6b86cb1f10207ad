from pager import page_count


def test_a_partial_last_page_counts():
    assert page_count(25, 10) == 3
