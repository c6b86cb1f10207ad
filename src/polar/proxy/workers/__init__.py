"""``polar gateway --workers N``: N gateway processes behind one listening address.

The parent process (:mod:`.supervisor`) opens the record store (its lock, its
recovery), starts N workers (:mod:`.worker`), each a whole gateway on a Unix
socket writing the same store, and serves the public address with a router
(:mod:`.router`) that sends every call of a session to the worker that owns it
(:mod:`.affinity`) and fans the admin API out to all of them.
"""
