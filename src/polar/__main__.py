"""``python -m polar`` is the ``polar`` command."""

from polar.cli import main

main()
