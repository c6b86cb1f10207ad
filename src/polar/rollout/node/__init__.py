"""A gateway node's side: :mod:`.service` (``Node``: leases, heartbeats, results)
behind :mod:`.app` (the ``/node`` API), running each session through
:mod:`.lifecycle` (prepare, the harness via :mod:`.agent`, evaluate, build),
within :mod:`.policy` (what a dispatched session may ask of the node).
"""
