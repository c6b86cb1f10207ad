"""What happens to one model call after its dialect has read it: the shared
request cycle (``serving``: authenticate, parse, relay, encode), its trip
through the gateway (``relay``: admit, call the engine, stream, record), what
it is sampled with (``behaviour``) and how many tokens it may sample
(``maxtokens``), who renders its prompt and parses its output (``capture``:
engine-rendered or gateway-rendered), and the event-loop hygiene the path
needs (``offload``: CPU-heavy steps on bounded worker threads; ``readynext``:
writing what is ready together).
"""
