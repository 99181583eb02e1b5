import re


def slugify(text):
    """Lower-case URL slug: the words of `text` joined by single dashes ("Hello, World!" -> "hello-world")."""
    return re.sub(r"[^a-z0-9]", "-", text.lower())
