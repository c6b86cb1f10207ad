"""Bridges: Polar's rollouts inside trainers users already have.

One module per trainer, each imported only by the trainer that uses it (none
of them is imported here, so ``import polar`` never pulls a trainer in):

- :mod:`polar.bridges.trl`: a ``rollout_func`` and a reward function for
  TRL's ``GRPOTrainer``;
- :mod:`polar.bridges.verl`: an agent loop for verl's ``AgentLoopWorker``;
- :mod:`polar.bridges.slime`: a rollout function for slime's
  ``--rollout-function-path``;
- :mod:`polar.bridges.nemo_gym`: a NeMo Gym agent server (``/run``) for NeMo RL.

They share :mod:`polar.bridges.config` (the one config file every bridge
reads) and :mod:`polar.bridges.rollouts` (submitting groups to the rollout
server, waiting, choosing what a trainer receives). Token ids, loss masks and
logprobs reach each trainer exactly as the gateway recorded them: no bridge
tokenizes anything.
"""
