"""Where a call arrives: the gateway's HTTP/1.1 server (``httpwire``: uvicorn
on uvloop, one system call per event-loop turn's writes), the plain-ASGI hot
path model calls take past Starlette (``asgi``), and reading what the client
sent (``inbound``: API keys, size-limited JSON bodies, validation), the same
for every dialect.
"""
