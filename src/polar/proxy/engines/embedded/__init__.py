"""The embedded CPU engine: a Hugging Face causal LM behind vLLM's token-in completions API."""

from polar.proxy.engines.embedded.runner import Job, ModelRunner, SamplingParams, Step, sample
from polar.proxy.engines.embedded.server import create_engine_app

__all__ = ["Job", "ModelRunner", "SamplingParams", "Step", "create_engine_app", "sample"]
