"""A small shop's stock keeping."""

from shop.inventory import Inventory, OutOfStock

__all__ = ["Inventory", "OutOfStock"]
