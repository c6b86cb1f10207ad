"""The OpenAI Responses dialect (``POST /v1/responses``), as Codex and pi speak it."""
