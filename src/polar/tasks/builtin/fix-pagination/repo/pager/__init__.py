"""Pagination helpers."""

from pager.pages import get_page, page_count

__all__ = ["get_page", "page_count"]
