"""Settings files."""

from envfile.parse import parse_env

__all__ = ["parse_env"]
