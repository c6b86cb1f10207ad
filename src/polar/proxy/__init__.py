"""The gateway: a token-recording model-API proxy in front of an inference engine."""
