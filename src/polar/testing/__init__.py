"""Test doubles that are not part of the serving path.

``polar.testing.scripted`` is a scripted inference server speaking vLLM's and
SGLang's wire formats exactly (used by the tests, the benchmarks, the demo,
rehearsals and ``polar engine scripted``). Product code does not import this
package (``tests/test_layers.py`` checks it; the scripted engine behind
``polar engine scripted`` and rehearsals is the one listed exception). Running
an ASGI app on a background thread is a product utility:
:mod:`polar.serverthread`.
"""
