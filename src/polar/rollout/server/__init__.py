"""The rollout server's side: :mod:`.service` (``RolloutServer``: the task
lifecycle) composing :mod:`.nodes` (the node registry), :mod:`.dispatch`
(sessions onto nodes, the leases) and :mod:`.delivery` (task callbacks), behind
:mod:`.app` (the HTTP API), with its durable state in :mod:`.store`, its
refusals in :mod:`.errors` and its event stream in :mod:`.events`.
"""
