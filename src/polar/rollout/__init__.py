"""The rollout service: tasks in, groups of scored sessions out.

Two sides, one sub-package each: :mod:`.server` (the rollout server: tasks,
nodes, dispatch, callbacks, its store and API) and :mod:`.node` (a gateway
node: the session pipeline and the ``/node`` API). :mod:`.raynodes` places
nodes on a Ray cluster and :mod:`.deploy` assembles the processes.

Shared by both and by clients: :mod:`.protocol` (wire models), :mod:`.config`,
:mod:`.http` (bearer tokens and errors), :mod:`.client`, :mod:`.callbacks`
(signing), :mod:`.files` (task files shipped to nodes), :mod:`.failure` (whose
failure a failed session is) and :mod:`.conversation` (a trace as chat
messages, for SFT exports).
"""
