"""The tiny model and what it is taught: the wing for tests and demos without
a real model.

:mod:`.build` makes the default tiny model (a random Qwen3-architecture causal
LM with the real Qwen3 tokenizer, about 9.8M parameters, no network);
:mod:`.warmup` teaches it, by supervised steps, the tool-call format and one
scripted exchange so that an agent loop runs end to end on it; and
:mod:`.rehearsal` records each real CLI's own calls through a gateway in front
of a scripted engine and teaches the model to answer them (``polar model
init --agents``). It sits above the gateway, the harnesses and the rollout
side, whose parts it drives; only the command line and tests use it.
"""
