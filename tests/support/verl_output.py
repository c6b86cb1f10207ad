"""Polar's ``verl_output`` on one session, in verl's own interpreter.

Executed by the verl virtualenv's Python (``scripts/setup --verl``): ``python
verl_output.py REQUEST.json`` reads a session result (as the rollout server
sends it) and verl's lengths, builds the ``AgentLoopOutput`` Polar's agent
loop would return for it (verl's own pydantic model validates it), and writes
it as JSON next to the request (``output.json``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(request_path: str) -> None:
    from polar.bridges.config import TraceChoice
    from polar.bridges.rollouts import session_sample
    from polar.bridges.verl import verl_output
    from polar.rollout.protocol import SessionResult

    request = json.loads(Path(request_path).read_text())
    session = session_sample(
        SessionResult.model_validate(request["session"]), "g", TraceChoice.MAIN
    )
    output = verl_output(
        session,
        prompt_length=request["prompt_length"],
        response_length=request["response_length"],
        end_token=request["end_token"],
    )
    (Path(request_path).parent / "output.json").write_text(output.model_dump_json())


if __name__ == "__main__":
    main(sys.argv[1])
