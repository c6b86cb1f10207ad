from wordfreq.counts import top_words


def test_most_frequent_first():
    assert top_words("b a b c a b", 2) == [("b", 3), ("a", 2)]


def test_ties_are_alphabetical():
    assert top_words("zeta alpha", 2) == [("alpha", 1), ("zeta", 1)]


def test_ties_after_the_leader():
    text = "pear apple fig apple fig pear kiwi kiwi kiwi"
    assert top_words(text, 3) == [("kiwi", 3), ("apple", 2), ("fig", 2)]


def test_case_is_ignored():
    assert top_words("Dog dog DOG cat", 1) == [("dog", 3)]


def test_n_larger_than_the_vocabulary():
    assert top_words("one two", 5) == [("one", 1), ("two", 1)]


def test_n_of_zero_or_less():
    assert top_words("one two", 0) == []
    assert top_words("one two", -1) == []
