from wordfreq.counts import word_counts


def test_counting_ignores_case():
    assert word_counts("The cat and the hat") == {"the": 2, "cat": 1, "and": 1, "hat": 1}
