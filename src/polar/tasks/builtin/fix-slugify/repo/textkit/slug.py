"""Turn titles into URL slugs."""


def slugify(title):
    """Lower-case ``title`` and join its words with hyphens, for use in URLs."""
    return title.lower().replace(" ", "-")
