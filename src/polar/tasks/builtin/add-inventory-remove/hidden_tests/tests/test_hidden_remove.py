import pytest

from shop import Inventory, OutOfStock


@pytest.fixture
def inventory():
    stock = Inventory()
    stock.add("apple", 5)
    stock.add("pear", 2)
    return stock


def test_remove_takes_items_out(inventory):
    inventory.remove("apple", 3)
    assert inventory.count("apple") == 2


def test_remove_takes_one_by_default(inventory):
    inventory.remove("pear")
    assert inventory.count("pear") == 1


def test_removing_too_many_raises_and_changes_nothing(inventory):
    with pytest.raises(OutOfStock):
        inventory.remove("apple", 6)
    assert inventory.count("apple") == 5


def test_removing_an_unknown_item_raises(inventory):
    with pytest.raises(OutOfStock):
        inventory.remove("plum")


def test_an_item_at_zero_is_no_longer_listed(inventory):
    inventory.remove("pear", 2)
    assert inventory.count("pear") == 0
    assert inventory.items() == ["apple"]


@pytest.mark.parametrize("quantity", [0, -1])
def test_a_quantity_below_one_is_rejected(inventory, quantity):
    with pytest.raises(ValueError):
        inventory.remove("apple", quantity)
