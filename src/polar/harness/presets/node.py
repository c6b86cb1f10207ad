"""The Node.js release the npm-published CLIs run on.

Claude Code (2.1.2xx and later) and Qwen Code (0.16 and later) require Node
22 or newer (their ``engines``); every npm preset runs on this one release so
the CLIs behave the same on every machine, whatever ``node`` the system has.
It comes from the npm registry (:class:`polar.harness.package.NodeRuntime`).
"""

NODE_VERSION = "24.21.0"
"""An LTS release (Node 24), satisfying every pinned CLI's ``engines``."""
