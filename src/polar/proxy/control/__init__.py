"""The gateway's control side, for the rollout node and the trainer: sessions
and their API keys (``sessions``), the weight-sync gate that pauses, drains
and resumes calls (``gate``), and the admin endpoints over both (``admin``).
"""
