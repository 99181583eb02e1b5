def window_sums(values, k):
    """Return the sums of every contiguous window of length k, left to right.

    window_sums([1, 2, 3, 4], 2) == [3, 5, 7]; [] when k > len(values).
    """
    sums = []
    for start in range(len(values) - k):
        sums.append(sum(values[start:start + k]))
    return sums
