"""Roman numerals."""

VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def from_roman(text):
    """The integer a Roman numeral such as ``"MCMXCIV"`` stands for."""
    total = 0
    for symbol, following in zip(text, text[1:] + " "):
        value = VALUES[symbol]
        if following != " " and VALUES[following] > value:
            total -= value
        else:
            total += value
    return total
