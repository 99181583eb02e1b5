from intervals.merge import merge


def test_overlapping():
    assert merge([[1, 4], [3, 6]]) == [[1, 6]]


def test_disjoint():
    assert merge([[1, 2], [5, 6]]) == [[1, 2], [5, 6]]


def test_empty():
    assert merge([]) == []
