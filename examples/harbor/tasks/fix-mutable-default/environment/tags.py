def add_tag(tag, tags=[]):
    """Return tags followed by tag, as a new list; tags defaults to no tags."""
    tags.append(tag)
    return tags
