"""Read ``KEY=value`` settings files (a small subset of the .env format)."""


def parse_env(text):
    """The settings in ``text`` as a dict.

    Blank lines and lines starting with ``#`` are ignored. Every other line is
    ``KEY=value``; whitespace around the key and around the value is dropped.
    """
    settings = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=")
        settings[key.strip()] = value.strip()
    return settings
