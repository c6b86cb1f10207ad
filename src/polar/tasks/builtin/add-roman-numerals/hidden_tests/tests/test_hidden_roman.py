import pytest

from numerals.roman import from_roman, to_roman


@pytest.mark.parametrize(
    ("number", "numeral"),
    [
        (1, "I"),
        (4, "IV"),
        (9, "IX"),
        (14, "XIV"),
        (40, "XL"),
        (90, "XC"),
        (400, "CD"),
        (1994, "MCMXCIV"),
        (2024, "MMXXIV"),
        (3999, "MMMCMXCIX"),
    ],
)
def test_known_numerals(number, numeral):
    assert to_roman(number) == numeral


@pytest.mark.parametrize("number", [0, -1, 4000])
def test_out_of_range(number):
    with pytest.raises(ValueError):
        to_roman(number)


def test_round_trip():
    for number in range(1, 4000):
        assert from_roman(to_roman(number)) == number
