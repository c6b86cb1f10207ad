"""Reading ``Authorization: Bearer <token>``: the one place Polar does it.

The gateway's session keys and admin token, the rollout server's and nodes'
control token, the dashboard's and the sandbox relay's keys all arrive this
way. Each caller compares the token itself (in constant time) and decides what
a missing or empty one means; this only takes the header's value apart, as
bytes (the header as it arrived) or as text (decoded by the server), with that
type's own idea of the blanks around the token.
"""

from __future__ import annotations

from typing import Any, AnyStr

_SCHEME: dict[type, Any] = {bytes: (b" ", b"bearer"), str: (" ", "bearer")}


def bearer_token(value: AnyStr) -> AnyStr | None:
    """The token in the ``Authorization`` value ``value`` (``Bearer <token>``,
    the scheme in any case, the token without the blanks around it: possibly
    empty); None when the scheme is not Bearer."""
    space, bearer = _SCHEME[type(value)]
    scheme, _, token = value.partition(space)
    return token.strip() if scheme.lower() == bearer else None
