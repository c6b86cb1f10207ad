"""Provider dialects the gateway speaks to harnesses: one package per dialect.

Each package has ``protocol`` (wire models), ``translate`` (pure wire <-> IR),
``stream`` (SSE encoding) and ``routes`` (thin Starlette handlers).
"""
