import pytest

from tinycalc.parse import parse_number


def test_integer():
    assert parse_number("42") == 42
    assert type(parse_number("42")) is int


def test_float():
    assert parse_number("-3.5") == -3.5


def test_rejects_words():
    with pytest.raises(ValueError):
        parse_number("forty")
