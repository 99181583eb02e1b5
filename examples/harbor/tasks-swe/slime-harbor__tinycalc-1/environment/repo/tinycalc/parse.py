def parse_number(text):
    """Parse a decimal number written as text: "42" -> 42, "-3.5" -> -3.5, " 7 " -> 7.

    Integers come back as int, anything with a decimal point as float.
    """
    if "." in text:
        return float(text)
    if text.isdigit():
        return int(text)
    raise ValueError(f"not a number: {text!r}")
