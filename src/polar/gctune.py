"""Python's cyclic garbage collector, tuned for a long-running server.

A server allocates most of its long-lived objects at start-up (modules, the
tokenizer, the app) and then, per request, many short-lived ones that
reference counting frees. With the default thresholds the collector still
runs a young collection every 700 net allocations and, every 100 of those, a
full one that walks every object start-up made: measured under load, a fifth
of the gateway's CPU per reply. So, once start-up is done:

* :func:`gc.freeze` moves everything alive into a permanent generation that
  no collection walks again;
* the young generation's threshold is raised, so a collection runs every
  ``young`` allocations instead of every 700 (cycles still get collected,
  later; memory held by them is bounded by the threshold's worth of objects).

Only process entry points call this (it changes the whole process).
"""

from __future__ import annotations

import gc

DEFAULT_YOUNG = 50_000


def tune_for_serving(young: int = DEFAULT_YOUNG) -> None:
    """Freeze what start-up allocated and set the collector's thresholds.
    ``young`` 0 leaves the thresholds as they are (still freezing)."""
    gc.collect()
    gc.freeze()
    if young:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young, middle, old)
