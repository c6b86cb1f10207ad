"""Test doubles and harness plumbing that are not part of the serving path.

``polar.testing.scripted`` is a scripted inference server speaking vLLM's and
SGLang's wire formats exactly (used by the tests, the benchmarks, the demo and
``polar engine scripted``); ``polar.testing.serverthread`` runs an ASGI app
under uvicorn on a background thread. Nothing in ``polar.proxy`` imports this
package.
"""
