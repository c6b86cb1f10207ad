"""The top-level request fields the IR does not model, shared by the dialects'
pure translators: they ride in ``ChatRequest.extra`` so that ``request_from_ir``
rebuilds the body the harness sent."""

from __future__ import annotations

from collections.abc import Set
from typing import Any

import pydantic


def unmodeled_fields(wire: pydantic.BaseModel, modeled: Set[str]) -> dict[str, Any]:
    """The fields ``wire`` was sent with, less ``modeled``; undeclared fields as sent."""
    extra = {k: v for k, v in wire.model_dump(exclude_unset=True).items() if k not in modeled}
    extra.update(wire.model_extra or {})
    return extra
