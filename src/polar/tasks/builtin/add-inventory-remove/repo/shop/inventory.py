"""Stock keeping for a small shop."""


class OutOfStock(Exception):
    """More items were asked for than the inventory holds."""


class Inventory:
    def __init__(self):
        self._stock = {}

    def add(self, name, quantity=1):
        """Put ``quantity`` items called ``name`` into stock."""
        if quantity < 1:
            raise ValueError("quantity must be at least 1")
        self._stock[name] = self._stock.get(name, 0) + quantity

    def count(self, name):
        """How many items called ``name`` are in stock."""
        return self._stock.get(name, 0)

    def items(self):
        """Names of the items in stock, sorted."""
        return sorted(self._stock)
