from numerals.roman import from_roman


def test_reading():
    assert from_roman("MCMXCIV") == 1994
    assert from_roman("XIV") == 14
