"""Agent programs Polar ships, for presets that run them inside a session's sandbox.

Each is one standard-library-only file: the ``polar`` package is hidden in
sandboxes, so a preset copies the file into the session and runs it with a
Python the sandbox has (:mod:`polar.harness.presets.minicoder`).
"""
