from textkit.slug import slugify


def test_single_word():
    assert slugify("release") == "release"


def test_lowercases_words():
    assert slugify("Release Notes") == "release-notes"
