"""Split a list of items into numbered pages."""


def page_count(total, per_page):
    """How many pages ``total`` items fill, ``per_page`` to a page."""
    return total // per_page + 1


def get_page(items, number, per_page):
    """The items on page ``number``; pages are numbered from 1."""
    start = number * per_page
    return items[start : start + per_page]
