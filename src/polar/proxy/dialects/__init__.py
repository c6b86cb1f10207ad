"""Provider dialects the gateway speaks to harnesses: one package per dialect.

Each package has ``protocol`` (wire models), ``translate`` (pure wire <-> IR),
``stream`` (SSE encoding), ``routes`` (thin handlers) and ``dialect`` (its
:class:`~polar.proxy.dialects.spec.DialectSpec`); :mod:`.registry` lists them,
and the app, the group's router and the rollout side iterate that list. A new
dialect is a new package and one line in the registry.
"""
