"""The rollout service: tasks in, groups of scored sessions out.

The rollout server's side: :mod:`.server` (the task lifecycle) composing
:mod:`.nodes` (the node registry), :mod:`.dispatch` (sessions onto nodes, the
leases) and :mod:`.delivery` (task callbacks), behind :mod:`.server_app`, with
its durable state in :mod:`.store`, its refusals in :mod:`.errors` and its
event stream in :mod:`.events`.

A gateway node's side: :mod:`.node` and :mod:`.node_app`, running each session
through :mod:`.lifecycle` (prepare, the harness via :mod:`.agent`, evaluate,
build), within :mod:`.policy`; :mod:`.raynodes` places nodes on a Ray cluster
and :mod:`.deploy` assembles the processes.

Shared by both and by clients: :mod:`.protocol` (wire models), :mod:`.config`,
:mod:`.http` (bearer tokens and errors), :mod:`.client`, :mod:`.callbacks`
(signing), :mod:`.files` (task files shipped to nodes), :mod:`.failure` (whose
failure a failed session is) and :mod:`.conversation` (a trace as chat
messages, for SFT exports).
"""
