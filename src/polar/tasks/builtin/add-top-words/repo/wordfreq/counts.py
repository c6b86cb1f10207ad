"""Word frequencies of English text."""

import re
from collections import Counter

WORD = re.compile(r"[a-z']+")


def word_counts(text):
    """How often each word occurs in ``text``, ignoring case."""
    return Counter(WORD.findall(text.lower()))
