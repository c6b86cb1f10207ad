"""Inference engines the gateway can sit in front of, looked up by name."""
