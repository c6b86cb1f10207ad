from textkit import slugify


def test_words_are_joined_with_hyphens():
    assert slugify("hello world") == "hello-world"
