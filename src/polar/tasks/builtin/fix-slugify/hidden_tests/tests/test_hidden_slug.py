from textkit import slugify


def test_punctuation_is_dropped():
    assert slugify("Hello, World!") == "hello-world"


def test_runs_of_separators_become_one_hyphen():
    assert slugify("  Polar -- RL in 2025 ") == "polar-rl-in-2025"


def test_symbols_between_words():
    assert slugify("C++ & Rust: 2 languages") == "c-rust-2-languages"


def test_a_slug_stays_as_it_is():
    assert slugify("already-a-slug") == "already-a-slug"


def test_upper_case_is_lowered():
    assert slugify("MixedCASE") == "mixedcase"


def test_nothing_left_gives_an_empty_slug():
    assert slugify("!!!") == ""
