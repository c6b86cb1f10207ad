from shop import Inventory


def test_adding_counts_up():
    inventory = Inventory()
    inventory.add("apple", 3)
    inventory.add("apple")
    assert inventory.count("apple") == 4
    assert inventory.items() == ["apple"]
