"""Signed callbacks: how a receiver knows a task result came from the rollout
server, without the server ever sending it a token.

The server POSTs a finished task's :class:`~polar.rollout.protocol.TaskResult`
to the submission's ``callback_url`` with two headers:

- ``x-polar-timestamp``: the Unix time of signing, in whole seconds;
- ``x-polar-signature``: ``v1=`` and the hex HMAC-SHA256 of
  ``<timestamp> "." <body bytes>`` under the signing secret: the submission's
  ``callback_secret`` when it gave one, else the server's control token.

A receiver checks both with :func:`verify` (constant-time comparison, and a
timestamp within ``tolerance_s`` so that a captured callback cannot be
replayed later). No ``Authorization`` header is sent: the callback URL is the
submitter's to choose, and a token sent there would be a token given away.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

SIGNATURE_HEADER = "x-polar-signature"
TIMESTAMP_HEADER = "x-polar-timestamp"
VERSION = "v1"
TOLERANCE_S = 300.0


class InvalidSignature(Exception):
    """The callback is not signed with the expected secret, or too old."""


def signature(body: bytes, secret: str, timestamp: int) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"{VERSION}={digest.hexdigest()}"


def signed_headers(body: bytes, secret: str, *, now: float | None = None) -> dict[str, str]:
    """The headers that sign ``body`` (plus its content type)."""
    timestamp = int(time.time() if now is None else now)
    return {
        "content-type": "application/json",
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: signature(body, secret, timestamp),
    }


def verify(
    body: bytes,
    headers: Mapping[str, str],
    secret: str,
    *,
    tolerance_s: float = TOLERANCE_S,
    now: float | None = None,
) -> None:
    """Raise :class:`InvalidSignature` unless ``headers`` sign ``body`` with ``secret``
    within ``tolerance_s`` of ``now``. ``headers`` may be any mapping with
    lower-case names (``httpx``, ``starlette`` and ``http.server`` headers all
    look names up case-insensitively)."""
    stamp = headers.get(TIMESTAMP_HEADER)
    given = headers.get(SIGNATURE_HEADER)
    if stamp is None or given is None:
        raise InvalidSignature(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}")
    try:
        timestamp = int(stamp)
    except ValueError:
        raise InvalidSignature(f"{TIMESTAMP_HEADER} is not a whole number") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise InvalidSignature(f"the signature is {current - timestamp:.0f} s old")
    expected = signature(body, secret, timestamp).encode()
    if not hmac.compare_digest(given.encode("utf-8", "replace"), expected):
        raise InvalidSignature("the signature does not match")
